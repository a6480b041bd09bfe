"""Regenerate tests/training/megatron_backend/data/reference_model_args.json: the reference's MODEL_ARGS of every
spec miles names, from a checkout of the reference (radixark/miles), through the reference's own loader
(miles/utils/external_utils/model_args_utils.py::load_model_args, which imports scripts/models/<name>.py).

    python -m tools.reference_model_args /path/to/radixark-miles-checkout [COMMIT]

Nothing of the reference is copied into this repository but the argument strings it prints.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests/training/megatron_backend/data/reference_model_args.json"


def reference_args(checkout: Path, names: list[str]) -> dict[str, str]:
    for var in ("MODEL_ARGS_NUM_LAYERS", "MODEL_ARGS_ROTARY_BASE"):  # the scripts' overrides: the defaults are wanted
        os.environ.pop(var, None)
    path = checkout / "miles/utils/external_utils/model_args_utils.py"
    spec = importlib.util.spec_from_file_location("model_args_utils", path)
    utils = importlib.util.module_from_spec(spec)
    sys.modules["model_args_utils"] = utils
    spec.loader.exec_module(utils)
    return {name: utils.load_model_args(name, model_script_dir=checkout / "scripts/models") for name in names}


def main(argv: list[str]) -> None:
    from miles_core.training.megatron.model_args import NAMED

    checkout, commit = Path(argv[0]), (argv[1] if len(argv) > 1 else "unknown")
    data = {"_source": f"radixark/miles@{commit} scripts/models/<name>.py via model_args_utils.load_model_args",
            **reference_args(checkout, sorted(NAMED))}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT} ({len(data) - 1} specs)")


if __name__ == "__main__":
    main(sys.argv[1:])
