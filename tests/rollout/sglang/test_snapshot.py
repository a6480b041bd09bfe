"""The ServerArgs snapshot: how tools/sglang_snapshot.py reads SGLang's declarations (on a small wheel
built here with each form 0.5.23 uses), and what the committed snapshot says about the pinned version."""

from __future__ import annotations

import json
import re
import textwrap
import tomllib
import zipfile
from pathlib import Path

from miles_core.rollout.sglang import SGLANG_VERSION
from miles_core.config.server_args import SNAPSHOT, snapshot
from tools.sglang_snapshot import render
from tools.sglang_snapshot import snapshot as read_wheel

ROOT = Path(__file__).resolve().parents[3]

SERVER_ARGS = '''
from sglang.srt.arg_groups.fields.serving import Serving
from sglang.srt.arg_groups.fields.parallel import Parallel
from sglang.srt.arg_groups.choices import GRAMMAR_CHOICES

class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--sampling-backend", type=str, choices=sorted(x), default=_declared_default("sampling_backend"))
        parser.add_argument("--config", type=str, help="Read CLI options from a config file. More.")
        parser.add_argument("--enable-dp-attention", action=DeprecatedStoreTrueAction, new_flag="--attn-dp-size <n>", help="Deprecated.")
        parser.add_argument("--old-spelling", action=DeprecatedStoreConstAction, dest="host", new_flag="--host")
        parser.add_argument("--legacy-fusion", action="store_true", help="(Deprecated) Fusion.")

_INPUT_NAMESPACES = [Parallel, Serving]
'''
SERVING = '''
from sglang.srt.arg_groups.choices import GRAMMAR_CHOICES

class Serving(msgspec.Struct):
    _NS_PATH = "serving"
    host: A[str, "The host of the HTTP server. Second sentence."] = "127.0.0.1"
    port: A[int, "The port."] = 30000
    model_path: A[str, Arg(help="Model weights.", aliases=["--model"])]
    skip_warmup: A[bool, "If set, skip warmup."] = False
    mem: A[Optional[float], Arg(help="Fraction.", fallback=0.8)] = None
    buckets: A[Optional[List[int]], "Buckets."] = None
    exclude: A[List[str], Arg(help="Prefixes.", nargs="*")] = msgspec.field(default_factory=list)
    grammar: A[str, Arg(help="Grammar.", choices=GRAMMAR_CHOICES)] = "xgrammar"
    mode: A[Literal["a", "b"], "Mode."] = "a"
    overrides: A[Optional[Dict], Arg(help="JSON.", type_parser=json.loads)] = None
    window: A[int, "Window."] = 1024 * 1024
    fast: A[bool, Arg(help="Fast.", action=argparse.BooleanOptionalAction)] = True
    verify: A[Optional[str], Arg(help="Verify.", nargs="?", const="")] = None
    sampling_backend: A[Optional[str], Arg(no_cli=True)] = None
    internal: int = 3
'''
PARALLEL = '''
class Parallel(msgspec.Struct):
    _NS_PATH = "parallel"
    tp_size: A[int, Arg(help="TP size.", aliases=["--tensor-parallel-size"])] = 1
    fp8_backend: A[str, Arg(help="FP8.", cli_name="--fp8-gemm-backend", choices=["auto", "triton"])] = "auto"
'''


def _wheel(tmp_path: Path) -> Path:
    path = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("sglang/srt/server_args.py", SERVER_ARGS)
        z.writestr("sglang/srt/arg_groups/fields/serving.py", SERVING)
        z.writestr("sglang/srt/arg_groups/fields/parallel.py", PARALLEL)
        z.writestr("sglang/srt/arg_groups/choices.py", 'GRAMMAR_CHOICES = ["xgrammar", "outlines"]\n')
    return path


def test_reader_follows_add_cli_args_from_dataclass_rules(tmp_path):
    data = read_wheel(_wheel(tmp_path), "9.9.9")
    f = data["fields"]
    assert list(f) == sorted(f) and "sampling_backend" in f and "internal" not in f  # no_cli + a manual registration
    assert f["host"] == {"name": "host", "flags": ["--host"], "namespace": "serving", "kind": "value", "type": "str",
                         "nullable": False, "default": "127.0.0.1", "help": "The host of the HTTP server"}
    assert f["model_path"]["flags"] == ["--model-path", "--model"] and f["model_path"]["required"] is True
    assert (f["skip_warmup"]["kind"], f["skip_warmup"]["default"]) == ("store_true", False)
    assert (f["mem"]["type"], f["mem"]["nullable"], f["mem"]["default"]) == ("float", True, None)
    assert (f["buckets"]["kind"], f["buckets"]["type"], f["buckets"]["nargs"]) == ("list", "list[int]", "+")
    assert (f["exclude"]["nargs"], f["exclude"]["default"]) == ("*", [])
    assert (f["grammar"]["choices"], f["grammar"]["choices_open"]) == (["xgrammar", "outlines"], True)  # a named list
    assert f["mode"]["choices"] == ["a", "b"] and "choices_open" not in f["mode"]  # Literal: closed
    assert f["overrides"]["type"] == "json" and f["window"]["default"] == 1048576
    assert f["fast"]["kind"] == "boolean_optional" and f["fast"]["default"] is True
    assert (f["verify"]["kind"], f["verify"]["const"]) == ("optional_value", "")
    assert f["tp_size"]["flags"] == ["--tp-size", "--tensor-parallel-size"]
    assert f["fp8_backend"]["flags"] == ["--fp8-gemm-backend"] and f["fp8_backend"]["choices"] == ["auto", "triton"]
    assert f["sampling_backend"]["namespace"] == "serving" and f["sampling_backend"]["choices_expr"] == "sorted(x)"
    assert f["enable_dp_attention"]["deprecated"] == "--attn-dp-size <n>" and f["config"]["help"] == "Read CLI options from a config file"
    assert data["deprecated_spellings"] == {"--old-spelling": "host"}
    assert (f["legacy_fusion"]["kind"], f["legacy_fusion"]["default"]) == ("store_true", False)


def test_committed_snapshot_is_the_pinned_version():
    data = json.loads(SNAPSHOT.read_text())
    assert data["sglang_version"] == SGLANG_VERSION
    assert SNAPSHOT.read_text() == render(data)  # written by the tool (stable formatting)
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sglang"]
    assert f"sglang=={SGLANG_VERSION}" in extra
    assert (ROOT / "Makefile").read_text().count("python -m tools.sglang_snapshot") == 1


def test_committed_snapshot_has_what_the_launcher_uses():
    args = snapshot().args
    assert len(args) > 400
    assert args["tp_size"].flags == ("--tp-size", "--tensor-parallel-size")
    for name, kind in [("model_path", "value"), ("host", "value"), ("port", "value"), ("api_key", "value"),
                       ("random_seed", "value"), ("enable_memory_saver", "store_true"), ("nnodes", "value"),
                       ("node_rank", "value"), ("dist_init_addr", "value")]:
        assert args[name].kind == kind and args[name].flag == "--" + name.replace("_", "-"), name
    assert args["mem_fraction_static"].type == "float"


PASSTHROUGH = re.compile(r"(?<![\w.-])(?:--sglang-([a-z0-9-]+)|sglang_([a-z0-9_]+))")
OPT_OUT = ("<!-- not-in-code -->", "# not-in-code")  # the docs check's markers of a line naming something absent on purpose


def _uses() -> list[tuple[str, str]]:
    """(file, name) of every passthrough a recipe or a doc page names (flag or key form)."""
    from miles_core.config import field_groups

    fields = set(field_groups())
    out = []
    for path in [*ROOT.glob("deployments/recipes/*.yaml"), *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]:
        if path.name in ("sglang.md", "compat.md") and path.parent.name == "reference":
            continue  # generated from the snapshot itself / from the reference's own flag list (names absent on purpose)
        lines = [line for line in path.read_text().splitlines() if not line.rstrip().endswith(OPT_OUT)]
        for flag, key in PASSTHROUGH.findall("\n".join(lines)):
            name = flag.replace("-", "_") if flag else key
            if f"sglang_{name}" not in fields and not name.startswith("no_"):
                out.append((str(path.relative_to(ROOT)), name))
    return out


def test_recipes_and_docs_use_only_passthroughs_the_snapshot_has():
    from miles_core.config.server_args import OWNED, PassthroughError, resolve

    uses = _uses()
    assert any(f.startswith("docs/") for f, _ in uses)  # the docs do show passthroughs (engines.md)
    bad = []
    for where, name in uses:
        try:
            resolve(name)
        except PassthroughError as e:
            if snapshot().spellings.get(name) not in OWNED:  # a page may name an owned one to say miles sets it
                bad.append(f"{where}: {e}")
    assert not bad, "\n".join(bad)
