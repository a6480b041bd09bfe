"""GPU check (docs/gpu.md): on one GPU, the figures of the scale path in one run, one JSON
(bench/results/gpu_check.json + .md).

    sglang    our SGLang launcher (miles_core/rollout/sglang/) on a random-weight Qwen2-0.5B: seconds to
              ready, generate tokens/s, and seconds per weight update through miles' WeightSync for each
              mode (tensor, disk, broadcast over NCCL and over gloo; one GPU holds sender and engine)
    torch     the torch trainer's GRPO train step (seconds, tokens/s, MFU)
    megatron  one megatron-core GRPO step with the Transformer-Engine layer spec (the local spec on CPU),
              miles' model mapping (training/megatron/) and losses: seconds, tokens/s, MFU

    python -m bench.gpu_check [--skip sglang,megatron] [--shape qwen2-0.5b|tiny] [--device cuda|cpu|auto] [--dry-run]

Each part reports its own error in the JSON (``ok: false``, ``error``) and the others still run. The model
is built here from Qwen2-0.5B's public config.json values with random weights (the step time does not depend
on them), saved as an HF dir under bench/.tmp. MFU = model FLOPs (bench/flops.py accounting: 3 x forward of
the real tokens) / (seconds x --peak-tflops; default by GPU name, none on CPU).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from .common import TMP, Result, table

QWEN2_05B = {  # Qwen/Qwen2-0.5B config.json (the values the model shape depends on)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151643, "use_sliding_window": False,
}
SHAPES = {
    "qwen2-0.5b": QWEN2_05B,
    "tiny": {**QWEN2_05B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 1},
}
PARTS = ("sglang", "torch", "megatron")
SYNC_MODES = {"tensor": ("tensor", "gloo"), "disk": ("disk", "gloo"), "broadcast-nccl": ("broadcast", "nccl"),
              "broadcast-gloo": ("broadcast", "gloo")}  # name -> (WeightSync mode, process-group backend)
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}  # dense bf16, by GPU name


def model_config(shape: str, dtype: str = "bfloat16") -> dict:
    """The HF config.json of ``shape`` (a name of SHAPES) in ``dtype``."""
    if shape not in SHAPES:
        raise ValueError(f"--shape {shape!r}: expected one of {sorted(SHAPES)}")
    return {**SHAPES[shape], "torch_dtype": dtype, "pad_token_id": 0}


def build_model_dir(shape: str, path: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """A random-weight Qwen2 of ``shape`` saved as an HF dir (config.json + model.safetensors) at ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = {k: v for k, v in model_config(shape, dtype).items() if k not in ("architectures", "model_type", "torch_dtype")}
    Qwen2ForCausalLM(Qwen2Config(**config)).to(getattr(torch, dtype)).save_pretrained(path)
    return path


def run_part(fn: Callable[[], dict], timeout_s: float | None = None) -> dict:
    """fn() -> {"ok": True, **figures}, or {"ok": False, "error", "traceback"}: a part never aborts the others.
    With timeout_s it runs in a daemon thread (a hung collective is reported, not waited for)."""
    box: dict = {}

    def call() -> None:
        try:
            box.update({"ok": True, **fn()})
        except BaseException as e:  # noqa: BLE001 - every failure is a figure of this check
            box.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-4000:])

    if timeout_s is None:
        call()
        return box
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return box if box else {"ok": False, "error": f"timed out after {timeout_s:.0f} s"}


def make_samples(n_prompts: int, group: int, prompt_len: int, resp_len: int, vocab: int) -> list:
    """B x G samples of fixed length P + T (random ids from 2, rewards alternating 0/1 inside each group)."""
    from miles_core.data.sample import Sample, Status

    rng = random.Random(0)
    out = []
    for g in range(n_prompts):
        prompt = [rng.randrange(2, vocab) for _ in range(prompt_len)]
        for k in range(group):
            resp = [rng.randrange(2, vocab) for _ in range(resp_len)]
            out.append(Sample(group_index=g, index=g * group + k, tokens=prompt + resp, response_length=resp_len,
                              loss_mask=[1] * resp_len, rollout_log_probs=[-3.0] * resp_len, reward=float(k % 2),
                              status=Status.COMPLETED, weight_versions=[0]))
    return out


def check_config(a: argparse.Namespace, model_dir: Path):
    """The TrainConfig every part reads (micro-batches of --micro-batch, one optimizer step per rollout; runtime ray:
    where rollout_engine sglang runs, though no Ray runtime is built here)."""
    from miles_core.config import build_config

    B, G, _, T = a.batch
    return build_config({
        "prompt_data": "builtin://arith", "hf_checkpoint": str(model_dir), "run_dir": str(a.work_dir / "run"),
        "rollout_batch_size": B, "n_samples_per_prompt": G, "micro_batch_size": a.micro_batch, "rollout_max_response_len": T,
        "dtype": a.dtype, "device": a.device, "runtime": "ray", "rollout_engine": "sglang", "lr": 1e-6,
        "sglang_skip_tokenizer_init": True, "sglang_mem_fraction_static": 0.5,  # random ids, no tokenizer; room for the sender
    })


def step_figures(seconds: list[float], tokens: int, flops_per_step: float, peak_tflops: float | None) -> dict:
    """Median seconds per step, tokens/s and MFU (None without a peak)."""
    import statistics

    s = statistics.median(seconds)
    return {"step_s": s, "steps_s": seconds, "tokens": tokens, "tokens_per_s": tokens / s,
            "model_tflops_per_s": flops_per_step / s / 1e12,
            "mfu": (flops_per_step / s / 1e12 / peak_tflops) if peak_tflops else None}


def train_flops(shape: str, samples: list) -> float:
    """3 x forward FLOPs of every real token (bench/flops.py), on a meta-device copy of the model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from .flops import forward_flops_per_token

    config = {k: v for k, v in model_config(shape).items() if k not in ("architectures", "model_type", "torch_dtype")}
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**config))
    L = len(samples[0].tokens)
    return 3 * forward_flops_per_token(model, (L + 1) / 2) * sum(len(s.tokens) for s in samples)


# ---- the parts -------------------------------------------------------------------------------------
def part_torch(a: argparse.Namespace, model_dir: Path) -> dict:
    """The torch trainer (built as the runtimes build it, training/backends.py) on a GRPO rollout, timed after a warm-up."""
    from miles_core.training.backends import build_torch_trainer
    from miles_core.training.protocol import TrainerContext

    cfg = check_config(a, model_dir)
    trainer = build_torch_trainer(TrainerContext(cfg=cfg, model_path=model_dir, tokenizer=_PadOnly()))
    samples = make_samples(*a.batch, SHAPES[a.shape]["vocab_size"])
    rewards = [s.reward for s in samples]
    seconds = []
    for i in range(a.steps + 1):  # the first step warms up (allocator, kernels)
        t0 = time.perf_counter()
        out = trainer.train_rollout(samples, rewards, i)
        _sync_device()
        if i:
            seconds.append(time.perf_counter() - t0)
    return {"device": str(trainer.device), **step_figures(seconds, sum(len(s.tokens) for s in samples),
                                                          train_flops(a.shape, samples), a.peak_tflops),
            "grad_norm": out.steps[0]["train/grad_norm"]}


def part_megatron(a: argparse.Namespace, model_dir: Path) -> dict:
    """One GRPO step of megatron-core per timed repeat: forward, miles' advantages and policy loss, backward, AdamW, on
    the HF dir's weights (miles' HF -> Megatron mapping), so its first grad norm is the torch part's."""
    import torch

    from miles_core.algorithms import AdvantageInputs, LossInputs, Reducer, actor_loss, compute_advantages
    from miles_core.config.parallel import ParallelConfig
    from miles_core.device import resolve_device
    from miles_core.training.megatron import model as mmodel
    from miles_core.training.megatron import parallel, weights
    from miles_core.training.megatron.logprobs import mask_padded_vocab, token_log_probs
    from miles_core.training.megatron.model_args import from_hf_config
    from miles_core.training.megatron.trainer import load_hf_state

    cfg, device = check_config(a, model_dir), resolve_device(a.device)
    te = device.type == "cuda"
    args = from_hf_config(json.loads((model_dir / "config.json").read_text()))
    parallel.init_parallel(ParallelConfig(), seed=0, device=device.type)
    try:
        dtype = getattr(torch, a.dtype)
        stage = mmodel.build_stage(args, mmodel.transformer_config(args, ParallelConfig(), dtype, cpu=not te),
                                   use_transformer_engine=te)
        local = weights.shard(weights.hf_to_full(load_hf_state(model_dir, args), args), stage)  # the torch part's weights
        stage.load_state_dict({k: v.to(dtype) for k, v in local.items()}, strict=False)
        stage.to(device)
        opt = torch.optim.AdamW(stage.parameters(), lr=1e-6, fused=True)
        samples = make_samples(*a.batch, args.vocab_size)
        B, G, P, T = a.batch
        ids = torch.tensor([s.tokens for s in samples], device=device)  # [N, P + T], no padding
        pos = torch.arange(P + T, device=device).expand_as(ids)
        # TE's attention is causal by itself; the local spec takes the mask (True = masked), [1, 1, L, L]
        causal = None if te else ~torch.ones((P + T, P + T), dtype=torch.bool, device=device).tril()[None, None]
        mask = torch.ones((len(samples), T), device=device)  # [N, T]
        reduce = Reducer(cfg.algo.calculate_per_token_loss, num_samples=len(samples), num_tokens=float(mask.sum()))
        rewards = torch.tensor([s.reward for s in samples], device=device)
        groups = torch.tensor([s.group_index for s in samples], device=device)
        adv, _, _ = compute_advantages(cfg.algo, AdvantageInputs(rewards=rewards, group_index=groups, loss_mask=mask,
                                                                  old_log_probs=torch.zeros_like(mask)))  # [N, T] GRPO: rewards only

        def step() -> float:
            opt.zero_grad(set_to_none=True)
            for s in range(0, len(samples), a.micro_batch):
                rows = slice(s, s + a.micro_batch)
                logits = stage(input_ids=ids[rows], position_ids=pos[rows], attention_mask=causal)  # [n, P + T, V]
                resp = mask_padded_vocab(logits[:, P - 1 : -1].float() / cfg.rollout.rollout_temperature, args.vocab_size)
                logp = token_log_probs(resp, ids[rows, P:])  # [n, T]
                loss, _ = actor_loss(cfg.algo, LossInputs(log_probs=logp, old_log_probs=logp.detach(), advantages=adv[rows],
                                                          loss_mask=mask[rows]), reduce)
                loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(stage.parameters(), 1.0)
            opt.step()
            return float(norm)

        seconds, norm = [], None
        for i in range(a.steps + 1):
            t0 = time.perf_counter()
            norm = step()
            _sync_device()
            if i:
                seconds.append(time.perf_counter() - t0)
        spec = "transformer_engine" if te else "local"
        return {"device": str(device), "layer_spec": spec, "dtype": a.dtype, "grad_norm": norm,
                **step_figures(seconds, ids.numel(), train_flops(a.shape, samples), a.peak_tflops)}
    finally:
        parallel.teardown()


def part_sglang(a: argparse.Namespace, model_dir: Path) -> dict:
    """Launch, generate tokens/s, then one weight update per sync mode (each with its own error and timeout)."""
    from miles_core.rollout.http import EngineRouter, HTTPEngineClient
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams
    from miles_core.rollout.sglang.launch import engine_client_options, require_sglang
    from miles_core.rollout.sglang.process import SGLangProcess

    cfg = check_config(a, model_dir)
    require_sglang(cfg)
    launch = sglang_launch(a.work_dir)
    t0 = time.perf_counter()
    with SGLangProcess.start(cfg, launch, a.work_dir / "engines") as proc:
        proc.wait_ready(a.sglang_timeout)
        out: dict = {"ready_s": time.perf_counter() - t0}
        client = HTTPEngineClient(proc.url, **engine_client_options(cfg, launch.api_key))
        B, G, P, T = a.batch
        params = SamplingParams(temperature=1.0, max_new_tokens=T)
        requests = [GenerateRequest(input_ids=s.tokens[:P], params=params) for s in make_samples(B, G, P, 0, SHAPES[a.shape]["vocab_size"])]
        client.generate(requests[:2], seed=0)  # warm-up
        t1 = time.perf_counter()
        results = client.generate(requests, seed=1)
        dt = time.perf_counter() - t1
        new = sum(len(r.output_ids) for r in results)
        out.update(generate_s=dt, generated_tokens=new, generate_tokens_per_s=new / dt, requests=len(requests))
        router = EngineRouter.from_urls([proc.url], {"api_key": launch.api_key, "bucket_bytes": cfg.cluster.update_weight_buffer_size})
        out["weight_sync"] = {name: run_part(lambda m=name, v=v: _one_sync(cfg, router, client, model_dir, m, v), a.sync_timeout)
                              for v, name in enumerate(SYNC_MODES, start=1)}
        out["log"] = str(proc.log_path)
    return out


def sglang_launch(work_dir: Path):
    from miles_core.rollout.sglang.launch import EngineLaunch, new_api_key
    from miles_core.rollout.sglang.process import free_port

    return EngineLaunch(model_path=str(work_dir / "model"), host="127.0.0.1", port=free_port(), api_key=new_api_key())


def _one_sync(cfg, router, client, model_dir: Path, name: str, version: int) -> dict:
    """miles' WeightSync of the model's weights (held on the GPU, as a trainer holds them) into the engine."""
    import torch
    from transformers import AutoModelForCausalLM

    from miles_core.device import resolve_device
    from miles_core.weights.sync import WeightSender, WeightSync

    mode, backend = SYNC_MODES[name]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, cfg.misc.dtype)).to(resolve_device(cfg.cluster.device))
    sender = WeightSender(lambda: model.state_dict().items(), model.config)
    sync = WeightSync(mode, cfg.cluster.update_weight_buffer_size, cfg.run_dir / "weight_sync", backend=backend)
    try:
        seconds = sync.sync(sender, router, version)["perf/update_weights_time"]
    finally:
        sync.close()
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"seconds": seconds, "bytes": nbytes, "gb_per_s": nbytes / seconds / 1e9, "engine_version": client.get_weight_version()}


class _PadOnly:
    """The tokenizer a trainer reads here: its pad id (no text is encoded)."""

    pad_token_id = 0


def _sync_device() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---- command line ----------------------------------------------------------------------------------
def plan(a: argparse.Namespace) -> list[str]:
    """What a run does, one line per part (--dry-run prints it; nothing is built or launched)."""
    from miles_core.rollout.sglang.launch import launch_command

    model_dir = a.work_dir / "model"
    B, G, P, T = a.batch
    lines = [f"model: random-weight {a.shape} ({json.dumps(model_config(a.shape, a.dtype))}) -> {model_dir}",
             f"batch: {B} prompts x {G} samples, {P} prompt + {T} response tokens, micro-batches of {a.micro_batch}; "
             f"{a.steps} timed step(s) after one warm-up; device {a.device}"]
    for part in PARTS:
        if part in a.skip:
            lines.append(f"{part}: skipped")
        elif part == "sglang":
            cmd = launch_command(check_config(a, model_dir), sglang_launch(a.work_dir))
            shown = ["***" if i and cmd[i - 1] == "--api-key" else c for i, c in enumerate(cmd)]
            lines.append(f"sglang: {' '.join(shown)}; generate {B * G} requests; weight sync modes {list(SYNC_MODES)}")
        elif part == "torch":
            lines.append("torch: build_torch_trainer + train_rollout (GRPO)")
        else:
            import torch

            spec = "transformer_engine" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available()) else "local"
            lines.append(f"megatron: GPTModel with the {spec} layer spec in {a.dtype}, GRPO step")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--skip", default="", help=f"comma-separated parts to skip, of {','.join(PARTS)}")
    p.add_argument("--shape", default="qwen2-0.5b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu", "auto"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--batch", default="8x8x256x256", help="BxGxPxT: prompts, samples per prompt, prompt and response tokens")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="timed train steps (after one warm-up)")
    p.add_argument("--peak-tflops", type=float, default=None, help="peak TFLOP/s of one device for MFU (default: by GPU name)")
    p.add_argument("--sglang-timeout", type=float, default=300.0, help="seconds SGLang may take to become ready")
    p.add_argument("--sync-timeout", type=float, default=120.0, help="seconds one weight-sync mode may take")
    p.add_argument("--work-dir", type=Path, default=TMP / "gpu_check")
    p.add_argument("--name", default="gpu_check", help="result name: bench/results/<name>.json (MILES_BENCH_RESULTS moves it)")
    p.add_argument("--dry-run", action="store_true", help="print what would run, build and launch nothing")
    a = p.parse_args(argv)
    a.skip = {s for s in a.skip.split(",") if s}
    if a.skip - set(PARTS):
        p.error(f"--skip {sorted(a.skip - set(PARTS))}: expected parts of {list(PARTS)}")
    try:
        a.batch = tuple(int(x) for x in a.batch.split("x"))
        assert len(a.batch) == 4 and min(a.batch) > 0
    except (ValueError, AssertionError):
        p.error(f"--batch {a.batch!r}: expected BxGxPxT, four positive integers")
    if a.peak_tflops is None:
        a.peak_tflops = _peak_by_name()
    return a


def _peak_by_name() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


PART_FUNCTIONS = {"sglang": part_sglang, "torch": part_torch, "megatron": part_megatron}


def run(a: argparse.Namespace) -> Result:
    """Build the model, run every part not skipped (each with its own error), -> the Result (not written yet)."""
    from miles_core.env import configure_environment

    configure_environment()
    model_dir = a.work_dir / "model"
    figures = {"model": run_part(lambda: {"path": str(build_model_dir(a.shape, model_dir, a.dtype))})}
    for part in PARTS:
        if part in a.skip:
            figures[part] = {"ok": None, "skipped": True}
        elif not figures["model"]["ok"]:
            figures[part] = {"ok": False, "error": "the model was not built (see model)"}
        else:
            figures[part] = run_part(lambda part=part: PART_FUNCTIONS[part](a, model_dir))
    config = {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    return Result(bench="gpu_check", config=config, figures=figures, tables=[summary_table(figures)],
                  notes=plan(a), extra_packages=("sglang", "megatron-core", "transformer-engine"))


def summary_table(figures: dict) -> str:
    rows = []
    for part in PARTS:
        f = figures.get(part, {})
        what = ("skipped" if f.get("skipped") else f.get("error", "")[:120] if not f.get("ok") else
                ", ".join(f"{k} {f[k]:.4g}" for k in ("step_s", "tokens_per_s", "mfu", "ready_s", "generate_tokens_per_s")
                          if isinstance(f.get(k), float)))
        rows.append([part, {True: "ok", False: "error", None: "-"}[f.get("ok")], what])
    for name, f in figures.get("sglang", {}).get("weight_sync", {}).items():
        rows.append([f"sync {name}", "ok" if f["ok"] else "error", f"{f['seconds']:.3g} s" if f["ok"] else f["error"][:120]])
    return table(["part", "status", "figures"], rows)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        print("\n".join(plan(a)))
        return 0
    path = run(a).write(name=a.name)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
