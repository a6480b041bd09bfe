"""The docs check: the real docs pass, and a stale claim of each kind planted in a scratch copy is caught."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from tools.docs import DOCS
from tools.docs.check import check, metric_known, parse_value
from tools.docs.markdown import parse


def test_the_docs_and_readme_agree_with_the_code():
    """Every page and README.md, with the fast runnable blocks run."""
    problems = check(run=("fast",))
    assert not problems, "docs problems:\n" + "\n".join(map(str, problems))


@pytest.fixture()
def scratch(tmp_path) -> Path:
    """A scratch copy of docs/ (the real pages, generated ones included)."""
    shutil.copytree(DOCS, tmp_path / "docs")
    return tmp_path / "docs"


def plant(docs: Path, rel: str, old: str, new: str) -> None:
    path = docs / rel
    text = path.read_text()
    assert old in text, f"{rel} no longer contains {old!r}: pick another spot to plant"
    path.write_text(text.replace(old, new, 1))


def problems_of(docs: Path, kind: str, run=()) -> list[str]:
    return [str(p) for p in check(docs, readme=None, run=run) if p.kind == kind]


def test_the_scratch_copy_is_clean(scratch):
    assert check(scratch, readme=None, run=()) == []


# ---- the five kinds of the acceptance criteria -----------------------------------------------------
def test_a_removed_flag_is_caught(scratch):
    plant(scratch, "getting-started.md", "--num-rollout 2", "--num-rollouts 2")  # in a shell block
    plant(scratch, "getting-started.md", "(unless `--skip-eval-before-train`)", "(unless `--no-eval-before-train`)")  # in prose
    found = problems_of(scratch, "flag")
    assert any("--num-rollouts" in p and "getting-started.md" in p for p in found), found
    assert any("--no-eval-before-train" in p for p in found), found


def test_a_wrong_default_is_caught(scratch):
    plant(scratch, "guide/configuration.md", "`eps_clip` (default 0.2)", "`eps_clip` (default 0.3)")
    plant(scratch, "guide/configuration.md", "`advantage_estimator` (default `\"grpo\"`)", "`advantage_estimator` (default `\"ppo\"`)")
    found = problems_of(scratch, "default")
    assert any("eps_clip" in p and "0.3" in p and "0.2" in p for p in found), found
    assert any("advantage_estimator" in p and "ppo" in p for p in found), found


def test_a_moved_module_path_is_caught(scratch):
    plant(scratch, "guide/customization.md", "`miles_core.rollout.filters.FilterResult(keep, reason)`",
          "`miles_core.rollout.filter.FilterResult(keep, reason)`")
    plant(scratch, "guide/customization.md", "from miles_core.algorithms import LossInputs, Reducer",
          "from miles_core.algorithms.loss import LossInputs, Reducer")
    found = problems_of(scratch, "module")
    assert any("miles_core.rollout.filter.FilterResult" in p for p in found), found
    assert any("miles_core.algorithms.loss" in p for p in found), found


def test_an_unemitted_metric_name_is_caught(scratch):
    plant(scratch, "guide/mlflow.md", "`train/pg_clipfrac` and `train/ppo_kl`", "`train/clip_ratio` and `train/ppo_kl`")
    found = problems_of(scratch, "metric")
    assert any("train/clip_ratio" in p for p in found), found


def test_a_failing_command_is_caught(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "reference", docs / "reference")
    (docs / "page.md").write_text(textwrap.dedent("""
        # A page

        <!-- runnable -->
        ```bash
        miles config no-such-recipe-yaml.yaml
        ```
    """))
    found = problems_of(docs, "run", run=("fast",))
    assert len(found) == 1 and "exited 2" in found[0] and "no-such-recipe-yaml.yaml" in found[0], found


# ---- more kinds -------------------------------------------------------------------------------------
def test_a_stale_generated_page_is_caught(scratch):
    plant(scratch, "reference/config.md", "| `eps_clip` |", "| `eps_clip_lower` |")
    assert problems_of(scratch, "stale") == ["docs/reference/config.md:1: [stale] generated page is stale: "
                                            "run `python -m tools.docs generate` (or make docs)"]


def test_an_unknown_command_or_recipe_is_caught(scratch):
    plant(scratch, "guide/evaluation.md", "`miles eval TARGET`", "`miles evaluate TARGET`")
    plant(scratch, "models.md", "| `tiny-ppo` |", "| `tiny-ppo` `miles train tiny-sac` |")
    found = problems_of(scratch, "command")
    assert any("miles evaluate" in p for p in found) and any("tiny-sac" in p for p in found), found


def test_an_unknown_env_var_is_caught(scratch):
    plant(scratch, "getting-started.md", "`MILES_ALLOW_HUB=1`", "`MILES_ALLOW_HUB=1` (or `MILES_OFFLINE`)")
    found = problems_of(scratch, "env")
    assert any("MILES_OFFLINE" in p for p in found), found


def test_a_missing_file_path_is_caught(scratch):
    plant(scratch, "guide/backends.md", "`miles_core/rollout/hf_engine.py`", "`miles_core/rollout/engines/hf.py`")
    plant(scratch, "guide/prefect.md", "`miles_core/runtime/placement.py::build_runtime`", "`miles_core/runtime/placement.py::LocalRuntime`")
    found = problems_of(scratch, "path")
    assert any("miles_core/rollout/engines/hf.py" in p for p in found), found
    assert any("defines no LocalRuntime" in p for p in found), found


def test_a_bad_config_key_or_value_is_caught(scratch):
    plant(scratch, "guide/configuration.md", "  advantage_estimator: grpo", "  advantage_estimator: grpo2")
    plant(scratch, "guide/configuration.md", "rollout_max_response_len: 12", "rollout_max_response_length: 12")
    plant(scratch, "guide/customization.md", "tis_mode: truncate", "tis_mode: truncated")
    found = problems_of(scratch, "config")
    assert any("grpo2" in p for p in found), found
    assert any("rollout_max_response_length" in p for p in found), found
    assert any("MISConfig" in p and "tis_mode" in p for p in found), found


def test_a_renamed_name_is_caught(scratch):
    plant(scratch, "guide/backends.md", "`num_threads` sets", "`num_thread` sets")
    found = problems_of(scratch, "name")
    assert any("num_thread " in p for p in found), found


def test_a_planned_field_that_the_code_reads_is_caught(scratch):
    plant(scratch, "guide/customization.md", "| `eval_function_path` |", "| `eval_function_path`, `num_threads` (planned) |")
    found = problems_of(scratch, "planned")
    assert any("num_threads" in p for p in found), found


def test_a_flag_of_another_command_is_caught(scratch):
    plant(scratch, "guide/mlflow.md", "`miles export runs/tiny/checkpoints --export runs/tiny/export`",
          "`miles export runs/tiny/checkpoints --export runs/tiny/export --lr 1e-5`")
    found = problems_of(scratch, "flag")
    assert any("--lr is not a flag of miles export" in p for p in found), found


def test_a_gpu_block_is_only_parsed(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "reference", docs / "reference")
    (docs / "page.md").write_text("<!-- runnable: gpu -->\n```bash\nnvidia-smi-that-does-not-exist --x\n```\n\n"
                                  "<!-- runnable: gpu -->\n```bash\nif then fi (\n```\n")
    found = [str(p) for p in check(docs, readme=None, run=("fast", "slow")) if p.kind in ("run", "flag")]
    assert len(found) == 2 and "does not parse" in found[0] + found[1], found


def test_opt_out_and_history_pages(scratch):
    plant(scratch, "guide/mlflow.md", "Useful first charts:", "The reference's `rollout/spec_accept_rate` is not logged. <!-- not-in-code -->\n\nUseful first charts:")
    plant(scratch, "decisions.md", "# Decision log", "# Decision log\n\nWe dropped `--old-flag` and `train/old_metric`.")
    assert check(scratch, readme=None, run=()) == []


# ---- helpers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("1e-6", 1e-6), ("`0.2`", 0.2), ("None", None), ("true", True), ('"grpo"', "grpo"), ("512", 512)])
def test_parse_value(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize("name, known", [
    ("rollout/raw_reward", True), ("passrate/pass@k", True), ("passrate/pass_4", True), ("eval/<ds>-pass@k", True),
    ("train/mis_*", True), ("train/tis*", True), ("rollout/<key>", True), ("eval/<ds>/response_len/mean", True),
    ("eval/<ds>-response_len/mean", False), ("train/clip_ratio", False), ("perf/step_time", True), ("perf/not_a_timer", False),
])
def test_metric_names_in_docs(name, known):
    assert metric_known(name) is known


def test_markdown_parser_finds_markers_spans_and_indented_commands():
    page = parse("docs/x.md", textwrap.dedent("""
        Text with `a_span` and `--flag`.

        <!-- runnable -->
        ```bash
        miles recipes
        ```

            miles train tiny --num-rollout 2

        ```yaml
        lr: 1.0e-5
        ```
    """))
    assert [(b.lang, b.run) for b in page.blocks] == [("bash", "fast"), ("yaml", None)]
    assert [s for _, s in page.spans] == ["a_span", "--flag"]
    assert [t for _, t in page.indented] == ["miles train tiny --num-rollout 2"]


def test_default_claims_in_their_forms():
    from tools.docs.check import Code, PageCheck

    text = ("`update_weight_buffer_size` (default 512 MiB), `--lr` (default 1e-6), `eps_clip_high` defaults to `eps_clip`, "
            "`gamma` and `lambd` default to 1.\n`rollout_top_k` (default 5) and `--num-epoch` defaults to 2.")
    found = [str(p) for p in PageCheck(parse("docs/x.md", text), Code(), set()).check()]
    assert len(found) == 2 and "rollout_top_k" in found[0] and "--num-epoch" in found[1], found


def test_a_wrong_flag_of_a_background_bench_run_is_caught_on_either_side_of_the_separator(scratch):
    """`python -m bench bg start [bg flags] -- <bench command>`: each part is checked against its own parser."""
    plant(scratch, "performance.md", "bg start --require-quiet -- orchestration --repeats 8",
          "bg start --require-silence -- orchestration --repetitions 8")
    found = problems_of(scratch, "flag")
    assert any("--require-silence" in p and "bench.background" in p for p in found), found
    assert any("--repetitions" in p and "python -m bench" in p for p in found), found
    assert not any("--require-quiet" in p or "--steps" in p for p in found), found


# ---- issue 20: a flag's value, an env var written with a value ------------------------------------
def test_an_invalid_flag_value_is_caught(scratch):
    """(a) a value the field refuses: a Literal choice in a shell block, a range in a prose code span, a type
    in --flag=value form."""
    plant(scratch, "getting-started.md", "--advantage-estimator gspo", "--advantage-estimator dpo")
    plant(scratch, "index.md", "`--rollout-batch-size 8`", "`--rollout-batch-size 0`")
    plant(scratch, "guide/configuration.md", "`--lr 3e-5`", "`--lr=fast`")
    found = problems_of(scratch, "value")
    assert any("--advantage-estimator dpo" in p and "getting-started.md" in p for p in found), found
    assert any("--rollout-batch-size 0" in p and "greater than or equal to 1" in p for p in found), found
    assert any("--lr fast" in p for p in found), found
    assert len(found) == 3, found  # valid values and placeholders (`--lr <x>`) pass


def test_an_env_var_written_with_a_value_is_caught(scratch):
    """(b) `NAME=1` in a code span: NAME must be a variable miles sets or reads."""
    plant(scratch, "guide/mlflow.md", "Useful first charts:", "Set `MILES_NO_SUCH_SWITCH=1` first.\n\nUseful first charts:")
    plant(scratch, "guide/mlflow.md", "Useful first charts:", "Or `MILES_ALSO_UNKNOWN=1 miles train tiny`.\n\nUseful first charts:")
    found = problems_of(scratch, "env")
    assert any("MILES_NO_SUCH_SWITCH" in p for p in found), found
    assert any("MILES_ALSO_UNKNOWN" in p for p in found), found
    plant(scratch, "guide/mlflow.md", "Useful first charts:", "Set `MILES_METRICS_CHECK=error`.\n\nUseful first charts:")
    plant(scratch, "guide/mlflow.md", "Useful first charts:", "Build with `GPU_ARCH=gfx942`.\n\nUseful first charts:")
    env = problems_of(scratch, "env")
    assert not any("MILES_METRICS_CHECK" in p or "GPU_ARCH" in p for p in env), env  # read, or a docker build argument
