"""Weight sync trainer -> engine server per mode (tensor, broadcast, disk) vs memcpy of the same bytes.

Model: a Qwen2 config scaled to ~100M parameters (vocab 32000, hidden 768, 8 layers, ffn 2048,
12 heads, 4 KV heads, untied lm_head), random init, fp32 (~400 MB). The sender is the model in this
process (``WeightSender``), the engine(s) `python -m miles_core.rollout.http.server` subprocesses on
127.0.0.1 loaded from the same weights; each case is one full ``WeightSync.sync`` (pause -> flush ->
buckets -> set version -> continue) into every engine, timed end to end. Baseline: ``copy_`` of every
tensor into a preallocated twin in this process (memcpy of the same bytes); ratio = sync / memcpy.
Cases run interleaved (memcpy, tensor, broadcast, disk) ``repeats`` times after one warm-up round
(the broadcast group is created in the warm-up, as in a run where it is built at the first sync).

Not included: in the Ray runtime, tensor mode first fetches rank 0's tensors through the object store
(an extra copy the disk and broadcast modes avoid: their bytes never pass through the driver).
"""

from __future__ import annotations

import shutil
import time

import torch

from .common import TMP, Result, fmt_stat, summarize, table

MODES = ("tensor", "broadcast", "disk")


def build_model(path, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from miles_core.models import resolve_model_path
    from miles_core.env import cache_dir

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
                      num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).float()
    model.save_pretrained(path)
    from transformers import AutoTokenizer  # any tokenizer: the server needs one to start, this bench never decodes

    AutoTokenizer.from_pretrained(resolve_model_path("builtin://tiny-qwen2", cache_dir())).save_pretrained(path)
    return model


def memcpy_time(named: list[tuple[str, torch.Tensor]], dst: list[torch.Tensor]) -> float:
    t0 = time.perf_counter()
    for (_, src), d in zip(named, dst):
        d.copy_(src)
    return time.perf_counter() - t0


def bench(repeats: int = 3, engines: int = 1, bucket_mb: int = 512) -> Result:
    from miles_core.rollout.http import EngineRouter, spawn_server_process
    from miles_core.weights.sync import WeightSender, WeightSync

    work = TMP / "weight_sync"
    shutil.rmtree(work, ignore_errors=True)
    model = build_model(work / "model")
    named = [(k, v) for k, v in model.state_dict().items()]
    n_params = sum(t.numel() for _, t in named)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    dst = [torch.empty_like(t) for _, t in named]
    procs = [spawn_server_process(work / "model", ["--num-threads", "1"]) for _ in range(engines)]
    times: dict[str, list[float]] = {m: [] for m in ("memcpy", *MODES)}
    try:
        for p in procs:
            p.wait_ready(300)
        bucket = bucket_mb * 2**20
        sender = WeightSender(lambda: model.state_dict().items(), model.config)
        syncs = {m: WeightSync(m, bucket, disk_dir=work / "sync") for m in MODES}
        version = 0
        with EngineRouter.from_urls([p.url for p in procs], {"timeout_s": 600.0}, bucket_bytes=bucket) as router:
            for rnd in range(repeats + 1):
                t = {"memcpy": memcpy_time(named, dst)}
                for m in MODES:
                    with torch.no_grad():
                        model.model.norm.weight.add_(1.0)  # new weights each sync
                    version += 1
                    t[m] = syncs[m].sync(sender, router, version)["perf/update_weights_time"]
                if rnd:  # round 0 is the warm-up
                    for k, v in t.items():
                        times[k].append(v)
                print({k: round(v, 3) for k, v in t.items()}, flush=True)
            name = "model.norm.weight"
            assert torch.equal(router.slots[0].client.get_weights_by_name(name), model.state_dict()[name])
        for s in syncs.values():
            s.close()
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(work, ignore_errors=True)
    stats = {k: summarize(v) for k, v in times.items()}
    mem = stats["memcpy"]["median"]
    ratios = {m: stats[m]["median"] / mem for m in MODES}
    gbps = {k: nbytes / s["median"] / 1e9 for k, s in stats.items()}
    rows = [[k, fmt_stat(stats[k], " s"), f"{gbps[k]:.2f}", "1x" if k == "memcpy" else f"{ratios[k]:.0f}x"] for k in times]
    result = Result(
        bench="weight_sync",
        config={"params": n_params, "bytes": nbytes, "dtype": "float32", "engines": engines, "bucket_bytes": bucket,
                "repeats": repeats, "torch_threads": torch.get_num_threads()},
        figures={"seconds": stats, "gb_per_s": gbps}, ratios={f"{m}_over_memcpy": r for m, r in ratios.items()},
        noise={k: s["rel_iqr"] for k, s in stats.items()},
        tables=[table(["case", "seconds (IQR)", "GB/s", "x memcpy"], rows)],
        notes=[f"{n_params / 1e6:.0f}M parameters, {nbytes / 2**20:.0f} MiB fp32, {engines} engine server(s), buckets of {bucket_mb} MiB, "
               f"median of {repeats} interleaved rounds after a warm-up round.",
               "tensor: safetensors-encoded buckets POSTed over HTTP (encode + send + decode + copy); broadcast: gloo over "
               "loopback TCP, one collective per tensor, metadata over HTTP; disk: save model.safetensors to a temp dir, "
               "rename, the engine reads it back (page cache: the file is hot).",
               "Every sync includes pause, flush, set version, continue (a few ms of HTTP).",
               "memcpy: copy_ into preallocated tensors in one process (no serialization, no second process)."],
    )
    return result
