"""Rollout tokens/s: HTTP engines behind the router (1 and 2 engines) vs the in-process HFEngine.

Same requests everywhere: `--prompts` arith prompts of builtin://tiny-qwen2 x `--group` samples
each (a GRPO rollout), temperature 1, `--max-new-tokens`, one seed. Cases:
  inprocess_hf_tN          HFEngine.generate(requests, seed), default (dynamic) batching (torch threads N)
  inprocess_seeded_exact   HFEngine(batching="exact") in process: one request at a time (1 thread)
  inprocess_seeded_dynamic HFEngine(batching="dynamic") in process: batched, a generator per row (1 thread)
  http_{1,2}_engine(s)_{exact,dynamic}   EngineRouter over 1 or 2 server subprocesses
                           (`python -m miles_core.rollout.http.server --num-threads 1 --batching ...`)
tokens = completion tokens; tokens/s = tokens / median wall time of `--repeats` timed calls (after
one untimed warm-up call per case). Equality: exact cases must match the in-process exact output
bit for bit (1 vs 2 engines: the routing must not change results); dynamic cases report the
fraction of requests whose tokens equal the exact ones.

The machine this runs on has 2 CPUs shared with other jobs: absolute numbers swing between runs
and the load average is recorded; 2 engines can at best use both CPUs (one thread each).

Run: .venv/bin/python bench/http_engine_bench.py [--prompts 32 --group 8 --max-new-tokens 32 --repeats 3]
Output: bench/results/http_engine.json (also printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from miles_core.data.tasks import BUILTIN_TASKS  # noqa: E402
from miles_core.env import cache_dir, configure_library_environment  # noqa: E402
from miles_core.models import resolve_model_path  # noqa: E402
from miles_core.rollout.hf_engine import HFEngine  # noqa: E402
from miles_core.rollout.http import EngineRouter, HFEngine, spawn_server_process  # noqa: E402
from miles_core.rollout.protocol import GenerateRequest, SamplingParams  # noqa: E402

SEED = 1234


def build_requests(tokenizer, n_prompts: int, group: int, max_new: int) -> list[GenerateRequest]:
    rows = BUILTIN_TASKS["arith"].rows()[:n_prompts]
    params = SamplingParams(max_new_tokens=max_new, stop_token_ids=(tokenizer.eos_token_id,))
    return [GenerateRequest(tokenizer(r["input"])["input_ids"], params) for r in rows for _ in range(group)]


def measure(generate, requests, repeats: int, threads: int) -> tuple[dict, list]:
    torch.set_num_threads(threads)
    generate(requests)  # warm-up
    samples, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = generate(requests)
        samples.append(time.perf_counter() - t0)
    tokens = sum(r.completion_tokens for r in out)
    med = statistics.median(samples)
    row = {"median_s": round(med, 4), "min_s": round(min(samples), 4), "samples_s": [round(s, 4) for s in samples],
           "tokens": tokens, "tokens_per_s": round(tokens / med, 1)}
    return row, out


def same(a, b) -> bool:
    return [(r.output_ids, r.output_log_probs) for r in a] == [(r.output_ids, r.output_log_probs) for r in b]


def token_match(a, b) -> float:
    return round(sum(x.output_ids == y.output_ids for x, y in zip(a, b)) / len(a), 4)


def inprocess_cases(model_path, args) -> tuple[list[GenerateRequest], dict, dict]:
    engine = HFEngine.from_pretrained(model_path, batching="exact")
    requests = build_requests(engine.tokenizer, args.prompts, args.group, args.max_new_tokens)
    cases, outputs = {}, {}
    stock = HFEngine(engine.model, engine.tokenizer)
    for threads in (2, 1):
        cases[f"inprocess_hf_t{threads}"], _ = measure(lambda r: stock.generate(r, SEED), requests, args.repeats, threads)
    for batching in ("exact", "dynamic"):
        engine.batching = batching
        cases[f"inprocess_seeded_{batching}"], outputs[batching] = measure(lambda r: engine.generate(r, SEED), requests, args.repeats, 1)
    cases["inprocess_seeded_dynamic"]["token_match_vs_exact"] = token_match(outputs["dynamic"], outputs["exact"])
    return requests, cases, outputs


def http_cases(servers: dict, requests, outputs: dict, repeats: int) -> dict:
    cases = {}
    for batching, procs in servers.items():
        for n in (1, 2):
            with EngineRouter.from_urls([p.url for p in procs[:n]]) as router:
                row, out = measure(lambda r: router.generate(r, SEED), requests, repeats, 1)
            if batching == "exact":
                row["identical_to_inprocess_exact"] = same(out, outputs["exact"])
            else:
                row["token_match_vs_exact"] = token_match(out, outputs["exact"])
            cases[f"http_{n}_engine{'s' if n > 1 else ''}_{batching}"] = row
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    configure_library_environment()
    model_path = resolve_model_path("builtin://tiny-qwen2", cache_dir())

    # start the four servers first (start-ups overlap): idle servers cost no CPU during the cases
    servers = {b: [spawn_server_process(model_path, ["--num-threads", "1", "--batching", b]) for _ in range(2)]
               for b in ("exact", "dynamic")}
    try:
        for procs in servers.values():
            for p in procs:
                p.wait_ready()
        load_at_start = os.getloadavg()
        requests, cases, outputs = inprocess_cases(model_path, args)
        cases |= http_cases(servers, requests, outputs, args.repeats)
    finally:
        for procs in servers.values():
            for p in procs:
                p.stop()
    result = {
        "bench": "http_engine",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "loadavg_at_start": [round(x, 2) for x in load_at_start],
                    "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
        "workload": {"model": "builtin://tiny-qwen2", "prompts": args.prompts, "group": args.group,
                     "requests": len(requests), "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
                     "repeats": args.repeats, "server_torch_threads": 1},
        "cases": cases,
        "note": "2 shared CPUs: numbers are noisy; compare cases of the same run, not across runs.",
    }
    out = ROOT / "results" / "http_engine.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
