"""Memory bandwidth of this CPU and the decode floor it sets: ``python -m bench memory-bandwidth`` and
``python -m bench decode-floor``.

Bandwidth: the best median bytes/s over three kernels that stream an fp32 buffer far larger than the caches
(default 512 MiB): a sum (reads it once), a matrix-vector product over it as an [n, n] weight (reads it once,
the decode kernel itself) and a copy into a second buffer (reads and writes it: 2x its bytes), at the current
torch thread count.

Decode floor: a decode step of a batch of ``b`` rows at context ``c`` must read every weight used in a matmul
(the Linear layers and the LM head; the embedding lookup reads b rows) and each layer's K and V cache up to c:

    bytes(b, c) = itemsize * (P_matmul + 2 * n_layers * kv_heads * head_dim * c * b)
    floor(b, c) = bytes(b, c) / bandwidth

A step also does ``flops(b, c) = b * (2 * P_matmul + 4 * n_layers * hidden * c)`` of arithmetic, so its compute floor
is flops(b, c) / the fp32 matmul peak (bench/flops.py, measured in the same run): with enough rows (b of 16 on one
CPU thread) that floor is the higher one, and the step is held to the higher of the two ("binding floor").

``decode-floor`` measures, on a real model, the engine's decode step two ways against that floor, in one
run with the bandwidth: the model step alone (``LeanDecoder.step``, the static-KV-cache step the engine runs:
miles_core/rollout/lean_decode.py) and the engine's whole per-token time (``HFEngine.generate`` of ``steps`` new
tokens, less its prefill, over the decode steps it ran: sampling, bookkeeping and row selection included; rows
that stop leave the batch, so its floor is taken at the mean live rows).
"""

from __future__ import annotations

import statistics
import time

import torch

from .common import Result, fmt_stat, summarize, table
from .flops import matmul_params, measure_peak


def _median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(mib: int = 512, repeats: int = 10) -> dict:
    """-> {bytes_per_s (best kernel), by_kernel {sum, gemv, copy}: bytes/s, buffer_bytes, threads}."""
    n = int((mib * 2**20 / 4) ** 0.5)
    w = torch.randn(n, n)
    x, dst = torch.randn(n), torch.empty_like(w)
    nbytes = w.numel() * w.element_size()
    by_kernel = {
        "sum": nbytes / _median_s(lambda: w.sum(), repeats),
        "gemv": nbytes / _median_s(lambda: torch.mv(w, x), repeats),
        "copy": 2 * nbytes / _median_s(lambda: dst.copy_(w), repeats),
    }
    return {"bytes_per_s": max(by_kernel.values()), "by_kernel": by_kernel, "buffer_bytes": nbytes,
            "threads": torch.get_num_threads()}


def bandwidth_result(mib: int, repeats: int) -> Result:
    bw = measure_bandwidth(mib, repeats)
    res = Result("memory_bandwidth", {"buffer_mib": mib, "repeats": repeats})
    res.figures = bw
    res.tables.append(table(["kernel", "GB/s"], [[k, v / 1e9] for k, v in bw["by_kernel"].items()]))
    res.notes.append(f"bandwidth (best kernel) {bw['bytes_per_s'] / 1e9:.1f} GB/s over a {mib} MiB fp32 buffer at "
                     f"{bw['threads']} torch threads; copy counts read + write")
    return res


def decode_flops(model, batch: int, context: int) -> float:
    """FLOPs of one decode step: every matmul weight once per row, and attention over ``context`` per layer and row."""
    c = model.config
    return batch * (2 * matmul_params(model) + 4 * c.num_hidden_layers * c.hidden_size * context)


def decode_bytes(model, batch: int, context: int) -> int:
    """Bytes a decode step must read: the matmul weights once, each layer's K and V up to ``context`` per row."""
    c = model.config
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    itemsize = next(model.parameters()).element_size()
    return itemsize * (matmul_params(model) + 2 * c.num_hidden_layers * kv_heads * head_dim * context * batch)


def _prompts(tokenizer, batch: int, prompt_len: int) -> list[list[int]]:
    """``batch`` distinct prompts of exactly ``prompt_len`` tokens (no shared prefill: every row its own prompt)."""
    words = " ".join(f"item {i} costs {3 * i + 1} coins;" for i in range(4 * prompt_len))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"]
    return [ids[i : i + prompt_len] for i in range(batch)]


def measure_decode(engine, batch: int, prompt_len: int, steps: int, repeats: int) -> dict:
    """The lean model step and the engine's per-token time at ``batch`` rows, contexts prompt_len .. + steps."""
    from miles_core.rollout.lean_decode import LeanDecoder
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams

    model, tok = engine.model, engine.tokenizer
    prompts = _prompts(tok, batch, prompt_len)
    ids = torch.tensor(prompts)
    attn = torch.ones_like(ids)
    pos = torch.arange(prompt_len)[None].expand(batch, -1)
    step_s = []
    with torch.inference_mode():  # as the engine's generate
        for _ in range(repeats):
            out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
            lean = LeanDecoder(model, out.past_key_values, attn, steps)
            nxt, p = out.logits[:, -1].argmax(-1), pos[:, -1:] + 1
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                logits = lean.step(nxt, p)
                times.append(time.perf_counter() - t0)
                nxt, p = logits.argmax(-1), p + 1
            step_s.append(statistics.median(times[1:]))  # the first step touches the fresh cache
    params = SamplingParams(max_new_tokens=steps, temperature=1.0)
    requests = [GenerateRequest(input_ids=p, params=params) for p in prompts]
    prefill = [GenerateRequest(input_ids=p, params=SamplingParams(max_new_tokens=1, temperature=1.0)) for p in prompts]
    seeds = list(range(batch))
    engine.generate_seeded(requests, seeds)  # warm
    full_s, pre_s, n_steps, rows = [], [], [], []
    for r in range(repeats):  # alternating, medians of each, then the difference
        t0 = time.perf_counter()
        engine.generate_seeded(prefill, seeds)
        pre_s.append(time.perf_counter() - t0)
        before, t0 = engine.progress, time.perf_counter()
        results = engine.generate_seeded(requests, [s + r * batch for s in seeds])
        full_s.append(time.perf_counter() - t0)
        n_steps.append(engine.progress - before)
        rows.append(sum(len(x.output_ids) for x in results) / n_steps[-1])  # rows that sample EOS leave the batch
    per_step = (statistics.median(full_s) - statistics.median(pre_s)) / max(1, statistics.median(n_steps) - 1)
    return {"model_step_s": summarize(step_s), "engine_step_s": per_step, "engine_generate_s": summarize(full_s),
            "engine_prefill_s": summarize(pre_s), "engine_steps": statistics.median(n_steps), "engine_mean_rows": statistics.fmean(rows)}


def decode_result(model_name: str, batch: int, prompt_len: int, steps: int, repeats: int, mib: int) -> Result:
    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path
    from miles_core.rollout.hf_engine import HFEngine

    path = resolve_model_path(f"builtin://{model_name}", cache_dir())
    engine = HFEngine.from_pretrained(path)
    bw_before, peak_before = measure_bandwidth(mib, repeats), measure_peak(repeats=repeats)
    dec = measure_decode(engine, batch, prompt_len, steps, repeats)
    bw_after, peak_after = measure_bandwidth(mib, repeats), measure_peak(repeats=repeats)  # shared machine: around the run
    bw = max(bw_before["bytes_per_s"], bw_after["bytes_per_s"])
    peak = max(peak_before["peak_flops_per_s"], peak_after["peak_flops_per_s"])
    mean_ctx = prompt_len + steps / 2
    floor_s = decode_bytes(engine.model, batch, int(mean_ctx)) / bw
    weights_only_s = decode_bytes(engine.model, batch, 0) / bw
    model_ratio = dec["model_step_s"]["median"] / floor_s
    engine_floor_s = decode_bytes(engine.model, round(dec["engine_mean_rows"]), int(mean_ctx)) / bw
    engine_ratio = dec["engine_step_s"] / engine_floor_s
    compute_s = decode_flops(engine.model, batch, int(mean_ctx)) / peak
    engine_compute_s = decode_flops(engine.model, round(dec["engine_mean_rows"]), int(mean_ctx)) / peak
    binding_s, engine_binding_s = max(floor_s, compute_s), max(engine_floor_s, engine_compute_s)
    res = Result("decode_floor", {"model": model_name, "batch": batch, "prompt_len": prompt_len, "steps": steps,
                                  "repeats": repeats, "dtype": str(next(engine.model.parameters()).dtype),
                                  "matmul_params": matmul_params(engine.model)})
    res.figures = {"bandwidth": {"before": bw_before, "after": bw_after, "best_bytes_per_s": bw},
                   "decode_bytes_mean_context": decode_bytes(engine.model, batch, int(mean_ctx)),
                   "floor_s": floor_s, "engine_floor_s": engine_floor_s, "weights_only_floor_s": weights_only_s,
                   "matmul_peak": {"before": peak_before, "after": peak_after, "best_flops_per_s": peak},
                   "decode_flops_mean_context": decode_flops(engine.model, batch, int(mean_ctx)),
                   "compute_floor_s": compute_s, "engine_compute_floor_s": engine_compute_s, **dec}
    res.ratios = {"model_step_over_floor": model_ratio, "engine_step_over_floor": engine_ratio,
                  "model_step_over_compute_floor": dec["model_step_s"]["median"] / compute_s,
                  "model_step_over_binding_floor": dec["model_step_s"]["median"] / binding_s,
                  "engine_step_over_binding_floor": dec["engine_step_s"] / engine_binding_s}
    res.noise = {"model_step_rel_iqr": dec["model_step_s"]["rel_iqr"], "engine_generate_rel_iqr": dec["engine_generate_s"]["rel_iqr"],
                 "bandwidth_before_after": [bw_before["bytes_per_s"], bw_after["bytes_per_s"]]}
    res.tables.append(table(
        ["model", "batch x context", "bandwidth GB/s", "bandwidth floor ms", "matmul peak GFLOP/s", "compute floor ms",
         "model step ms", "engine ms/step (mean rows)", "model / bandwidth floor", "model / binding floor",
         "engine / its binding floor"],
        [[model_name, f"{batch} x {prompt_len}..{prompt_len + steps}", bw / 1e9, 1e3 * floor_s, peak / 1e9, 1e3 * compute_s,
          fmt_stat({k: 1e3 * v if k not in ("n", "rel_iqr") else v for k, v in dec["model_step_s"].items()}),
          f"{1e3 * dec['engine_step_s']:.3g} ({dec['engine_mean_rows']:.1f})",
          f"{model_ratio:.2f}x", f"{res.ratios['model_step_over_binding_floor']:.2f}x",
          f"{res.ratios['engine_step_over_binding_floor']:.2f}x"]]))
    res.notes += [
        f"floor = (matmul weights + K/V cache at the mean context {mean_ctx:.0f}) bytes / best bandwidth measured before and "
        f"after the run ({bw / 1e9:.1f} GB/s); the weights alone are {1e3 * weights_only_s:.2f} ms of it",
        f"compute floor = b * (2 * matmul params + 4 * layers * hidden * context) FLOPs / the best fp32 square-matmul FLOP/s "
        f"measured before and after the run ({peak / 1e9:.1f} GFLOP/s); the binding floor is the higher of the two",
        "model step = LeanDecoder.step (the engine's static-KV-cache step) at all rows, median over the steps of each repeat; "
        "engine = HFEngine.generate_seeded of up to `steps` tokens (temperature 1), less a 1-token generate (the prefill; "
        "medians of alternating runs), per decode step the engine ran; rows that sample EOS leave the batch, so its floor is at the mean live rows",
    ]
    return res
