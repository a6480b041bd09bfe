"""Where miles' GRPO step spends its time: stage timers (engine, reward + rollout file, train, sync) and a
torch-profiler op table per stage, with the share of time in matmul / attention kernels (compute) vs
everything else (elementwise ops, copies, framework overhead). Same setup as ``grpo-trl`` (tiny Qwen2,
arith, B x G x T), miles only.
"""

from __future__ import annotations

import statistics

from .common import Result, table
from .grpo_trl import MilesSide, Shape

COMPUTE_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::_fused_adamw_")


def _op_table(prof, steps: int, top: int = 12) -> tuple[list[list], dict]:
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    compute = sum(e.self_cpu_time_total for e in events if e.key in COMPUTE_OPS)
    rows = [[e.key, e.count // steps, e.self_cpu_time_total / steps / 1000, e.self_cpu_time_total / total]
            for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]]
    summary = {"op_ms_per_step": total / steps / 1000, "compute_share": compute / total if total else 0.0,
               "ops_per_step": sum(e.count for e in events) / steps}
    return rows, summary


def profile(shape_spec: str, steps: int, seed: int) -> Result:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    shape = Shape.parse(shape_spec)
    side = MilesSide(shape, seed, tag="profile")
    for _ in range(2):  # warm-up
        side.step()
    for _ in range(steps):
        side.step()
    parts = {k: statistics.median(v[2:]) for k, v in side.trace.parts.items()}
    parts["reward_and_rollout_io"] = parts["generate_reward"] - parts["engine"]
    res = Result("profile_step", {"shape": str(shape), "steps": steps, "seed": seed})
    res.figures["stage_median_s"] = parts
    res.figures["step_median_s"] = statistics.median(side.trace.seconds[2:])
    rt = side.rt
    for stage in ("generate", "train"):
        base = side.i
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for k in range(4):
                if stage == "generate":
                    rt.generate(base + k)
                else:
                    rt.train(base + k - 4)
        if stage == "generate":  # train the rollouts just generated, unprofiled, to keep the runtime consistent
            side.i += 4
        rows, summary = _op_table(prof, 4)
        res.figures[f"{stage}_ops"] = summary
        res.tables.append(f"**{stage}**: {summary['op_ms_per_step']:.0f} ms of op time per step, "
                          f"{100 * summary['compute_share']:.0f}% in matmul/attention/optimizer kernels, "
                          f"{summary['ops_per_step']:.0f} ops per step\n\n"
                          + table(["op", "calls/step", "ms/step", "share"], [[r[0], r[1], r[2], f"{100 * r[3]:.1f}%"] for r in rows]))
    step = res.figures["step_median_s"]
    res.tables.insert(0, table(["stage", "median s", "share of step"],
                               [[k, v, f"{100 * v / step:.0f}%"] for k, v in parts.items() if k != "generate_reward"]))
    res.notes.append("engine = HFEngine.generate; reward_and_rollout_io = scoring + writing the rollout file; "
                     "train = rollout file read + forward/backward + optimizer; sync = weight copy into the engine.")
    return res
