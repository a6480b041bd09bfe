"""Checkpoint save/load speed of `miles_core.checkpoint` next to plain safetensors, same tensors.

Model: a random-init fp32 Qwen2 of ~100M parameters (hidden 768, 12 layers, 12 heads / 4 KV heads,
ffn 2048, vocab 32000, tied embeddings), built offline from a config.

Measured in `--repeats` rounds; each round runs every case once, in a fixed order, each after an
untimed os.sync() (median and min reported, samples kept):
  plain_save          safetensors.torch.save_file(unique tensors)              no fsync
  plain_save_fsync    the same + fsync of the file                             what durability costs
  ckpt_save_model     save_checkpoint(model only, no optimizer)                temp dir, fsync, marker, rename, pointer
  plain_load          safetensors.torch.load_file + model.load_state_dict      weights land in the model
  plain_load_file     safetensors.torch.load_file alone                        (mmap: may defer reads)
  ckpt_load_model     load_checkpoint(model only)                              marker check + strict load + RNG
  ckpt_save_full / ckpt_load_full   with AdamW state (after one step)          ~3x the bytes
  export_hf           export_hf, one shard, stub tokenizer                     shard + index + config + marker
Ratios: median over rounds of (ckpt time / plain time in the same round); 1.0 = no overhead. On a
shared machine absolute times swing several-fold between runs; same-round ratios are the figure.
Loads read from the page cache (files were just written): this measures the library's overhead,
not the disk. Writes go to bench/.tmp/ (removed afterwards).

Run: .venv/bin/python bench/checkpoint_bench.py [--repeats 5]
Output: bench/results/checkpoint.json (also printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import safetensors
import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from miles_core.checkpoint import export_hf, load_checkpoint, save_checkpoint  # noqa: E402
from miles_core.checkpoint._tensors import split_aliases  # noqa: E402


def build_model() -> torch.nn.Module:
    config = transformers.Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).float()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _StubTokenizer:  # the bench measures weights + config; tokenizer files are tiny
    def save_pretrained(self, path):
        (Path(path) / "tokenizer.json").write_text("{}")


def make_cases(model, work: Path) -> tuple[dict, dict]:
    """`{case name: zero-arg function}` and `{case name: bytes it moves}`; files for loads exist."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, 32000, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()  # populate AdamW state for the *_full cases
    tensors = {k: v.contiguous() for k, v in split_aliases(model.state_dict())[0].items()}
    plain, save_dir = work / "plain.safetensors", work / "ckpt"

    def plain_load():
        state = load_file(plain)
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=True)

    cases = {
        "plain_save": lambda: save_file(tensors, plain),
        "ckpt_save_model": lambda: save_checkpoint(save_dir, 0, model=model, state={}),
        "plain_save_fsync": lambda: (save_file(tensors, plain), fsync_file(plain)),
        "plain_load": plain_load,
        "ckpt_load_model": lambda: load_checkpoint(model_info, model=model),
        "plain_load_file": lambda: load_file(plain),
        "ckpt_save_full": lambda: save_checkpoint(save_dir, 1, model=model, optimizer=opt, state={}),
        "ckpt_load_full": lambda: load_checkpoint(full_info, model=model, optimizer=opt),
        "export_hf": lambda: export_hf(model, _StubTokenizer(), work / "export", 0),
    }
    cases["plain_save"]()
    model_info, full_info = cases["ckpt_save_model"](), cases["ckpt_save_full"]()
    plain_bytes, model_bytes, full_bytes = plain.stat().st_size, dir_bytes(model_info.path), dir_bytes(full_info.path)
    sizes = {name: plain_bytes for name in cases}
    sizes.update(ckpt_save_model=model_bytes, ckpt_load_model=model_bytes, ckpt_save_full=full_bytes,
                 ckpt_load_full=full_bytes)  # fmt: skip
    return cases, sizes


def run_rounds(cases: dict, repeats: int) -> dict[str, list[float]]:
    """Each round runs every case once, in order, after an untimed os.sync(): a checkpoint case
    and its plain twin see the same machine load, so per-round ratios cancel most noise."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            os.sync()
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return samples


RATIOS = {
    "save_vs_plain": ("ckpt_save_model", "plain_save"),
    "save_vs_plain_fsync": ("ckpt_save_model", "plain_save_fsync"),
    "load_vs_plain_load_into_model": ("ckpt_load_model", "plain_load"),
}


def summarise(samples: dict[str, list[float]], sizes: dict[str, int]) -> dict:
    times = {}
    for name, s in samples.items():
        med = statistics.median(s)
        times[name] = {"median_s": round(med, 4), "min_s": round(min(s), 4), "samples_s": [round(x, 4) for x in s],
                       "bytes": sizes[name], "MB_per_s": round(sizes[name] / med / 1e6, 1)}  # fmt: skip
    ratios = {
        key: round(statistics.median(a / b for a, b in zip(samples[num], samples[den], strict=True)), 3)
        for key, (num, den) in RATIOS.items()
    }
    return {"times": times, "ratios_median_of_rounds": ratios}


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "transformers": transformers.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    work = ROOT / ".tmp" / f"checkpoint-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        model = build_model()
        n_params = sum(p.numel() for p in model.parameters())
        cases, sizes = make_cases(model, work)
        samples = run_rounds(cases, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if (ROOT / ".tmp").is_dir() and not any((ROOT / ".tmp").iterdir()):
            (ROOT / ".tmp").rmdir()
    result = {
        "bench": "checkpoint",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "repeats": args.repeats,
        "model": {"arch": "Qwen2ForCausalLM", "params": n_params, "dtype": "float32", "tied_embeddings": True},
        **summarise(samples, sizes),
    }
    out = ROOT / "results" / "checkpoint.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
