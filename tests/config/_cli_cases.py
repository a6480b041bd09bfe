"""Runs many `miles` command lines in this one process (the test of bad inputs: one interpreter start, not one a case).

stdin: a JSON list of {"args": [...], "env": {...}}; stdout: a JSON list of {"code", "output", "cpu_s", "heavy"} in that
order. Each line goes through the `miles` app as typer's CliRunner invokes it (the exit code main() passes on, stdout
and stderr together); ``cpu_s`` is this process's CPU time for that case, the first one's imports of the CLI included;
``heavy`` the modules of a run start (HEAVY) imported so far. torch is not among them: the recipe check
imports it (~2.3 s CPU, in the first such case's cpu_s here, in every one's as separate processes).
"""

from __future__ import annotations

import json
import sys
import time

HEAVY = ("transformers", "prefect", "mlflow")  # a model load, a flow start, a tracker: none before a bad input is refused


def main() -> None:
    from typer.testing import CliRunner

    cases = json.load(sys.stdin)
    t0 = time.process_time()
    from flows.cli import app

    runner, results = CliRunner(), []
    for case in cases:
        result = runner.invoke(app, case["args"], env=case["env"])
        t1 = time.process_time()
        results.append({"code": result.exit_code, "output": result.output, "cpu_s": t1 - t0,
                        "heavy": [m for m in HEAVY if m in sys.modules]})
        t0 = t1
    json.dump(results, sys.__stdout__)


if __name__ == "__main__":
    main()
