"""GPU check (docs/gpu.md): on one GPU, the figures of the scale path in one run, one JSON
(bench/results/gpu_check.json + .md).

    sglang    our SGLang launcher (miles_core/rollout/sglang/) on a random-weight Qwen2-0.5B: seconds to
              ready, generate tokens/s, and seconds per weight update through miles' WeightSync for each
              mode SGLang takes (disk, broadcast over NCCL and over gloo; one GPU holds sender and engine),
              SGLang 0.5.23's protocol (sessions, the version from /model_info): each mode on an engine launched
              for it (a fresh state: one failure or hang does not hide the others), then the engine's log-probs
              of its own samples against the sender model's (they must agree: the weights arrived) and against
              the launch weights' (they must not: else the probe could not tell)
    torch     the torch trainer's GRPO train step (seconds, tokens/s, MFU)
    megatron  the Megatron trainer's GRPO rollout with the Transformer-Engine layer spec (the local spec on CPU),
              THD-packed micro-batches, megatron-core's bf16 optimizer, then offload/onload, the weight gather and a
              checkpoint save + restore: seconds, tokens/s, MFU

    python -m bench.gpu_check [--skip sglang,megatron] [--shape qwen2-0.5b|tiny] [--device cuda|cpu|auto] [--dry-run]

Each part reports its own error in the JSON (``ok: false``, ``error``) and the others still run. The model
is built here from Qwen2-0.5B's public config.json values with random weights (the step time does not depend
on them), saved as an HF dir under bench/.tmp. tokens/s counts the batch's distinct tokens (each prompt once, every
response). MFU = model FLOPs of the step as each trainer computes it (bench/flops.py: packed_train_flops for the
torch trainer, which computes a group's prompt once and the LM head on responses only; train_flops for Megatron, every
sample's full sequence) / (seconds x --peak-tflops; default from PEAK_TFLOPS by GPU name, none on CPU).
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
# name -> (WeightSync mode, process-group backend). No "tensor": SGLang's body is CUDA-IPC handles (refused at load).
SYNC_MODES = {"disk": ("disk", "gloo"), "broadcast-nccl": ("broadcast", "nccl"), "broadcast-gloo": ("broadcast", "gloo")}
LOGPROB_TOL = 0.1  # max |engine - sender| log-prob of the engine's sampled tokens after a sync (bf16 kernels differ)
# Dense bf16 peak TFLOP/s (no sparsity) by the model in torch.cuda.get_device_name(), most specific first; vendor data
# sheets: H100 SXM 989.4, H100 PCIe 756.5, H100 NVL 835.5 (per GPU), H200 SXM 989.4, B200 2250, MI300X 1307.4.
PEAK_TFLOPS: tuple[tuple[str, str, float], ...] = (
    ("H100 NVL", "H100 NVL", 835.5),
    ("H100 PCIe", "H100 PCIe", 756.5),
    ("H100", "H100 SXM", 989.4),  # "NVIDIA H100 80GB HBM3"
    ("H200", "H200", 989.4),
    ("B200", "B200", 2250.0),
    ("MI300X", "MI300X", 1307.4),  # "AMD Instinct MI300X"
    ("A100", "A100", 312.0),
    ("L40S", "L40S", 362.0),
)


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


def check_config(a: argparse.Namespace, model_dir: Path, **overrides):
    """The TrainConfig every part reads (micro-batches of --micro-batch, one optimizer step per rollout; runtime ray:
    where rollout_engine sglang runs, though no Ray runtime is built here), with a part's ``overrides``."""
    from miles_core.assemble import build_config

    B, G, _, T = a.batch
    return build_config({
        "prompt_data": "builtin://arith", "hf_checkpoint": str(model_dir), "run_dir": str(a.work_dir / "run"),
        "rollout_batch_size": B, "n_samples_per_prompt": G, "micro_batch_size": a.micro_batch, "rollout_max_response_len": T,
        "dtype": a.dtype, "device": a.device, "runtime": "ray", "rollout_engine": "sglang", "lr": 1e-6,
        "sglang_skip_tokenizer_init": True, "sglang_mem_fraction_static": 0.5,  # random ids, no tokenizer; room for the sender
        **overrides,
    })


def step_figures(seconds: list[float], tokens: int, flops_per_step: float, peak_tflops: float | None) -> dict:
    """Median seconds per step, tokens/s (``tokens``: the distinct tokens of the batch) and MFU (None without a peak)."""
    import statistics

    s = statistics.median(seconds)
    return {"step_s": s, "steps_s": seconds, "tokens": tokens, "tokens_per_s": tokens / s, "flops_per_step": flops_per_step,
            "model_tflops_per_s": flops_per_step / s / 1e12,
            "mfu": (flops_per_step / s / 1e12 / peak_tflops) if peak_tflops else None}


def distinct_tokens(batch: tuple[int, int, int, int]) -> int:
    """The tokens a rollout holds: each prompt once (B x P), every response (B x G x T)."""
    B, G, P, T = batch
    return B * P + B * G * T


def meta_model(shape: str):
    """The Qwen2 of ``shape`` on the meta device (its FLOPs, no weights)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = {k: v for k, v in model_config(shape).items() if k not in ("architectures", "model_type", "torch_dtype")}
    with torch.device("meta"):
        return Qwen2ForCausalLM(Qwen2Config(**config))


def torch_step_flops(shape: str, batch: tuple[int, int, int, int], old_pass: bool) -> float:
    """The torch trainer's step as it computes it (bench/flops.py packed_train_flops): each group's prompt once, the
    LM head on the responses only; ``old_pass``: a separate old-log-prob forward (off when the step is on-policy)."""
    from .flops import packed_train_flops

    B, G, P, T = batch
    return packed_train_flops(meta_model(shape), [(P, [T] * G)] * B, old_pass)


def megatron_step_flops(shape: str, batch: tuple[int, int, int, int]) -> float:
    """The Megatron trainer's step as it computes it (bench/flops.py train_flops): every sample's prompt + response,
    the LM head at every position, and the old-log-prob forward pass."""
    from .flops import train_flops as sequence_flops

    B, G, P, T = batch
    return sequence_flops(meta_model(shape), [P + T] * (B * G), old_pass=True)


def timed_rollouts(trainer, samples: list, steps: int) -> tuple[list[float], object]:
    """train_rollout ``steps`` + 1 times (the first warms up: allocator, kernels) -> (seconds of the timed ones, last output)."""
    rewards = [s.reward for s in samples]
    seconds, out = [], None
    for i in range(steps + 1):
        t0 = time.perf_counter()
        out = trainer.train_rollout(samples, rewards, i)
        _sync_device()
        if i:
            seconds.append(time.perf_counter() - t0)
    return seconds, out


# ---- the parts -------------------------------------------------------------------------------------
def part_torch(a: argparse.Namespace, model_dir: Path) -> dict:
    """The torch trainer (built as the runtimes build it, training/backends.py) on a GRPO rollout, timed after a warm-up."""
    from miles_core.training.backends import build_torch_trainer
    from miles_core.training.protocol import TrainerContext

    cfg = check_config(a, model_dir)
    trainer = build_torch_trainer(TrainerContext(cfg=cfg, model_path=model_dir, tokenizer=_PadOnly()))
    seconds, out = timed_rollouts(trainer, make_samples(*a.batch, SHAPES[a.shape]["vocab_size"]), a.steps)
    flops = torch_step_flops(a.shape, a.batch, old_pass=not trainer.on_policy)
    return {**trainer.run_params(), **step_figures(seconds, distinct_tokens(a.batch), flops, a.peak_tflops),
            "grad_norm": out.steps[0]["train/grad_norm"]}


def part_megatron(a: argparse.Namespace, model_dir: Path) -> dict:
    """The Megatron trainer (training/megatron/) on a GRPO rollout, timed after a warm-up: on CUDA the Transformer-Engine
    spec, packed micro-batches as THD (use_dynamic_batch_size), megatron-core's bf16 optimizer with fp32 main weights;
    then offload / onload, the weight-sync gather (in the model dtype) and a checkpoint save + restore: what docs/gpu.md
    lists as written, not yet run on a GPU. On the HF dir's weights, so its grad norm is the torch part's."""
    from miles_core.training.megatron.trainer import MegatronTrainer

    B, G, P, T = a.batch
    cfg = check_config(a, model_dir, train_backend="megatron", use_dynamic_batch_size=True,
                       max_tokens_per_gpu=a.micro_batch * (P + T))
    trainer = MegatronTrainer(cfg, model_dir, pad_id=_PadOnly.pad_token_id)
    try:
        seconds, out = timed_rollouts(trainer, make_samples(*a.batch, SHAPES[a.shape]["vocab_size"]), a.steps)
        trainer.offload()
        trainer.onload()
        sent = sorted({str(t.dtype).removeprefix("torch.") for _, t in trainer.named_tensors()})
        trainer.save(a.work_dir / "megatron_ckpt", 0, {})
        restored = trainer.restore(a.work_dir / "megatron_ckpt") is not None
        return {**trainer.run_params(), "dtype": a.dtype, "sent_dtypes": sent, "restored": restored,
                **step_figures(seconds, distinct_tokens(a.batch), megatron_step_flops(a.shape, a.batch), a.peak_tflops),
                "grad_norm": out.steps[0]["train/grad_norm"]}
    finally:
        trainer.close()


def part_sglang(a: argparse.Namespace, model_dir: Path) -> dict:
    """Launch, generate tokens/s; then each sync mode on an engine launched for it (with its own error and timeout)."""
    from miles_core.rollout.http import HTTPEngineClient
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams
    from miles_core.rollout.sglang.launch import engine_client_options, require_sglang
    from miles_core.rollout.sglang.process import SGLangProcess

    cfg = check_config(a, model_dir)
    require_sglang(cfg)
    launch = sglang_launch(a.work_dir)
    B, G, P, T = a.batch
    params = SamplingParams(temperature=1.0, max_new_tokens=T)
    requests = [GenerateRequest(input_ids=s.tokens[:P], params=params) for s in make_samples(B, G, P, 0, SHAPES[a.shape]["vocab_size"])]
    t0 = time.perf_counter()
    with SGLangProcess.start(cfg, launch, a.work_dir / "engines") as proc:
        proc.wait_ready(a.sglang_timeout)
        out: dict = {"ready_s": time.perf_counter() - t0, "log": str(proc.log_path)}
        client = HTTPEngineClient(proc.url, **engine_client_options(cfg, launch.api_key))
        client.generate(requests[:2], seed=0)  # warm-up
        t1 = time.perf_counter()
        results = client.generate(requests, seed=1)
        dt = time.perf_counter() - t1
        new = sum(len(r.output_ids) for r in results)
        out.update(generate_s=dt, generated_tokens=new, generate_tokens_per_s=new / dt, requests=len(requests))
    # run_part(...) of a dict that has its own "ok": that one is kept (a failed sync is a figure, not an error of the part)
    out["weight_sync"] = {name: run_part(lambda m=name, v=v: sync_on_fresh_engine(a, cfg, model_dir, m, v, requests[:4]))
                          for v, name in enumerate(SYNC_MODES, start=1)}
    return out


def sglang_launch(work_dir: Path):
    from miles_core.rollout.sglang.launch import EngineLaunch, new_api_key
    from miles_core.rollout.sglang.process import free_port

    return EngineLaunch(model_path=str(work_dir / "model"), host="127.0.0.1", port=free_port(), api_key=new_api_key())


def sync_on_fresh_engine(a: argparse.Namespace, cfg, model_dir: Path, name: str, version: int, probe: list) -> dict:
    """One sync mode on an SGLang engine launched for it: a fresh state (the launch weights, version 0, no session, no
    process group), so a mode that fails, or hangs in its collective, leaves nothing behind for the next one; the engine
    is stopped afterwards in any case (a hung sync's thread then finds its peer gone). -> _one_sync's figures, or
    {"ok": False, "error", ...}."""
    from miles_core.rollout.sglang.process import SGLangProcess

    launch = sglang_launch(a.work_dir)
    t0 = time.perf_counter()
    with SGLangProcess.start(cfg, launch, a.work_dir / "engines") as proc:
        proc.wait_ready(a.sglang_timeout)
        ready_s = time.perf_counter() - t0
        opts = {"api_key": launch.api_key, "bucket_bytes": cfg.cluster.update_weight_buffer_size}
        result = run_part(lambda: _one_sync(cfg, proc.url, opts, model_dir, name, version, probe), a.sync_timeout)
    return {**result, "ready_s": ready_s, "log": str(proc.log_path)}


SYNC_SCALE = 1.5  # the sender's weights: the launch weights x (SYNC_SCALE + version / 100), far enough for the probe to tell


def _one_sync(cfg, url: str, client_opts: dict, model_dir: Path, name: str, version: int, probe: list) -> dict:
    """miles' WeightSync of weights of its own (the launch weights scaled, held on the GPU as a trainer holds them) into a
    fresh engine (it serves version 0, /model_info), on its own router; then the engine's log-probs of its own samples:
    equal to the sender model's (within LOGPROB_TOL), and unlike the launch weights' (else the probe tells nothing)."""
    import torch
    from transformers import AutoModelForCausalLM

    from miles_core.device import resolve_device
    from miles_core.rollout.http import EngineRouter
    from miles_core.weights.sync import WeightSender, WeightSync

    mode, backend = SYNC_MODES[name]
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, cfg.misc.dtype)).to(  # noqa: E731
        resolve_device(cfg.cluster.device))
    model, launched = load(), load()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(SYNC_SCALE + version / 100)
    sender = WeightSender(lambda: model.state_dict().items(), model.config)
    sync = WeightSync(mode, cfg.cluster.update_weight_buffer_size, cfg.run_dir / "weight_sync", backend=backend)
    with EngineRouter.from_urls([url], client_opts) as router:
        client = router.slots[0].client
        before = client.get_weight_version()  # GET /model_info
        if before != 0:
            raise RuntimeError(f"the engine for the {name} sync is not fresh: it serves version {before}")
        try:
            seconds = sync.sync(sender, router, version)["perf/update_weights_time"]
        finally:
            sync.close()
        gap, control = logprob_gaps([model, launched], client, probe)
        served = client.get_weight_version()
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if served != version or gap > LOGPROB_TOL or control <= LOGPROB_TOL:
        raise RuntimeError(f"after the {name} sync the engine serves version {served} (want {version}), log-prob gap "
                           f"{gap:.3g} to the sender (tolerance {LOGPROB_TOL}), {control:.3g} to the launch weights "
                           f"(must exceed {LOGPROB_TOL}: else the probe cannot tell the weights apart)")
    return {"seconds": seconds, "bytes": nbytes, "gb_per_s": nbytes / seconds / 1e9, "engine_version": served,
            "logprob_max_abs_diff": gap, "logprob_diff_to_launch_weights": control}


def logprob_gap(model, engine, requests: list) -> float:
    """Max |log-prob| difference of the engine's sampled tokens, engine vs ``model`` scoring the same ids."""
    return logprob_gaps([model], engine, requests)[0]


def logprob_gaps(models: list, engine, requests: list) -> list[float]:
    """logprob_gap of each of ``models`` over one generate of the engine (the same samples for every model)."""
    from miles_core.models.scoring import score_tokens

    results = engine.generate(requests, seed=7)
    ids = [list(r.input_ids) + res.output_ids for r, res in zip(requests, results)]
    out = []
    for model in models:
        scored = score_tokens(model, ids, requests[0].params.temperature)
        out.append(max((abs(a - b) for r, res, s in zip(requests, results, scored)
                        for a, b in zip(res.output_log_probs, s[len(r.input_ids) - 1:])), default=0.0))
    return out


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
            lines.append(f"sglang: {' '.join(shown)}; generate {B * G} requests; weight sync modes {list(SYNC_MODES)}, "
                         "each on an engine launched for it")
        elif part == "torch":
            lines.append("torch: build_torch_trainer + train_rollout (GRPO)")
        else:
            import torch

            from miles_core.training.megatron.model import layer_spec

            cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
            spec = layer_spec("cuda" if cuda else "cpu").name
            lines.append(f"megatron: MegatronTrainer with the {spec} layer spec in {a.dtype}, GRPO rollouts, offload/onload, "
                         "weight gather, checkpoint save + restore")
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
    return peak_for(torch.cuda.get_device_name())


def peak_for(device_name: str) -> float | None:
    """The dense bf16 peak TFLOP/s of the GPU ``device_name`` names (PEAK_TFLOPS), None for one not in the table."""
    return next((tflops for key, _, tflops in PEAK_TFLOPS if key in device_name), None)


PART_FUNCTIONS = {"sglang": part_sglang, "torch": part_torch, "megatron": part_megatron}


def run(a: argparse.Namespace) -> Result:
    """Build the model, run every part not skipped (each with its own error), -> the Result (not written yet)."""
    from flows.env import configure_environment

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
