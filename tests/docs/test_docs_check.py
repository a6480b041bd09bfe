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


def plant(docs: Path, rel: str, old: str, new: str) -> int:
    """Replace the first ``old`` of the page by ``new``; -> the line where ``new`` starts."""
    path = docs / rel
    text = path.read_text()
    assert old in text, f"{rel} no longer contains {old!r}: pick another spot to plant"
    path.write_text(text.replace(old, new, 1))
    return text[:text.index(old)].count("\n") + 1


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


def test_after_recipe_import_the_flags_are_the_importers(scratch):
    """`miles recipe import ... -- <flags>`: the reference's flags are fine there (not `miles recipe`'s own), a typo is not."""
    plant(scratch, "guide/coming-from-the-reference.md", "-- --lr 2e-6 --eps-clip-high 0.28", "-- --lr 2e-6 --eps-clip-hi 0.28")
    found = problems_of(scratch, "flag")
    mine = [p for p in found if "coming-from-the-reference" in p]
    assert mine and all("--eps-clip-hi" in p for p in mine), found  # --lr, --eps-clip (...) and --base, -o pass
    assert any("--eps-clip-hi is not a flag `miles recipe import` knows" in p for p in mine), found


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


# ---- issue 35: four more kinds of stale claim, and deployment names -------------------------------
CHARTS = "Useful first charts:"  # a paragraph of guide/mlflow.md before which the tests plant new ones


def plant_lines(docs: Path, rel: str, lines: list[str]) -> list[int]:
    """Plant each line as its own paragraph before CHARTS; -> their line numbers."""
    first = plant(docs, rel, CHARTS, "\n\n".join(lines) + "\n\n" + CHARTS)
    return [first + 2 * i for i in range(len(lines))]


def test_a_wrong_default_in_other_phrasings_is_caught(scratch):
    """"is N by default", "by default `x` is N", "(default: N)", "N (the default)" and a table's default column."""
    lines = plant_lines(scratch, "guide/mlflow.md", [
        "`eps_clip` is 0.3 by default.", "By default, `num_epoch` is 3.", "`kl_coef`, the KL weight (default: 0.5), ...",
        "Set `--lr` to 5e-6 (the default).", "`advantage_estimator: ppo` (the default) ...",
        "The default of `eps_clip` is 0.25.", "`num_epoch` is set to 2 by default.", "By default `kl_coef` = 0.1.",
        "`eps_clip` is 0.2 by default and `lr` is 1e-6 by default.",  # true claims: no problem
    ])
    at = plant(scratch, "guide/backends.md", "a local Ray) | `local` |\n", "a local Ray) | `ray` |\n")  # the runtime row's default cell
    found = problems_of(scratch, "default")
    expect = [(lines[0], "eps_clip: the page says default 0.3, the code's default is 0.2"),
              (lines[1], "num_epoch: the page says default 3, the code's default is 1"),
              (lines[2], "kl_coef: the page says default 0.5, the code's default is 0.0"),
              (lines[3], "--lr: the page says default 5e-6, the code's default is 1e-06"),
              (lines[4], 'advantage_estimator: the page says default ppo, the code\'s default is "grpo"'),
              (lines[5], "eps_clip: the page says default 0.25, the code's default is 0.2"),
              (lines[6], "num_epoch: the page says default 2, the code's default is 1"),
              (lines[7], "kl_coef: the page says default 0.1, the code's default is 0.0")]
    for line, message in expect:
        assert f"docs/guide/mlflow.md:{line}: [default] {message}" in found, (line, message, found)
    assert any(p.startswith(f"docs/guide/backends.md:{at}:") and 'runtime: the page says default ray, the code\'s default is "local"' in p
               for p in found), found
    assert len(found) == 9, found


def test_an_unlogged_metric_in_a_table_of_a_list_item_is_caught(scratch):
    """A table (or text) indented under a list item or an admonition is prose there, not an indented code block;
    a name under any catalog prefix (multi_turn/ too) is a metric name."""
    at = plant(scratch, "guide/mlflow.md", CHARTS, "1. Metrics:\n\n    | metric | meaning |\n    |---|---|\n"
                                                  "    | `perf/some_metric` | a timer |\n    | train/bare_cell_metric | bare |\n"
                                                  "    | rollout/<k> | pattern |\n\n!!! note\n\n    `train/bogus_ratio` is logged.\n\n"
                                                  "Also `multi_turn/bogus_count`.\n\n" + CHARTS)
    found = sorted(problems_of(scratch, "metric"), key=lambda p: int(p.split(":")[1]))
    assert found == [f"docs/guide/mlflow.md:{at + 4}: [metric] perf/some_metric is not in the metrics catalog (miles_core/tracking/catalog.py)",
                     f"docs/guide/mlflow.md:{at + 5}: [metric] train/bare_cell_metric is not in the metrics catalog "
                     "(miles_core/tracking/catalog.py)",
                     f"docs/guide/mlflow.md:{at + 10}: [metric] train/bogus_ratio is not in the metrics catalog (miles_core/tracking/catalog.py)",
                     f"docs/guide/mlflow.md:{at + 12}: [metric] multi_turn/bogus_count is not in the metrics catalog "
                     "(miles_core/tracking/catalog.py)"], found


def test_an_env_var_value_its_reader_refuses_is_caught(scratch):
    """Each value is parsed by the function the reading code calls (envvalues.parsers), and reported with its message."""
    shell = plant(scratch, "advanced/what-happens-when.md", "MILES_FAULT_INJECT=generate@1 miles", "MILES_FAULT_INJECT=generate@one miles")
    lines = plant_lines(scratch, "guide/mlflow.md", [
        "`MILES_METRICS_CHECK=loud`", "`MILES_ALLOW_HUB=true`", "`PREFECT_LOGGING_LEVEL=LOUD`", "`GPU_ARCH=gfx900`",
        "`MILES_FAULT_INJECT=boot@1`", "`export MILES_METRICS_CHECK=quiet`", "```bash\nenv MILES_ALLOW_HUB=yes miles eval tiny\n```",
        "`MILES_DEBUG=1`, `PREFECT_LOGGING_LEVEL=INFO`, `MILES_ENGINE_API_KEY=$KEY`",  # taken: no problem
    ])
    found = problems_of(scratch, "env")
    expect = [
        ("advanced/what-happens-when.md", shell, "MILES_FAULT_INJECT=generate@one: not a value its reader takes; it says: "
         "MILES_FAULT_INJECT: bad item 'generate@one'; expected <stage>@<id>[x<attempts>], e.g. generate@1 or save@0x2"),
        ("guide/mlflow.md", lines[0], "MILES_METRICS_CHECK=loud: not a value its reader takes; it says: MILES_METRICS_CHECK='loud': "
         "expected error, warn, off"),
        ("guide/mlflow.md", lines[1], "MILES_ALLOW_HUB=true: not a value its reader takes; it says: MILES_ALLOW_HUB='true': "
         "expected 1 (download from the hub) or 0 (offline, the default)"),
        ("guide/mlflow.md", lines[2], "PREFECT_LOGGING_LEVEL=LOUD: not a value its reader takes; it says: level: Input should be "
         "'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'"),
        ("guide/mlflow.md", lines[3], "GPU_ARCH=gfx900: not a value its reader takes; it says: docker/build.py passes GPU_ARCH as "
         "gfx942, gfx950 (VARIANTS), not gfx900"),
        ("guide/mlflow.md", lines[4], "MILES_FAULT_INJECT=boot@1: not a value its reader takes; it says: MILES_FAULT_INJECT: unknown "
         "stage 'boot' in 'boot@1'; stages: generate, train, save, sync, eval, export, register"),
        ("guide/mlflow.md", lines[5], "MILES_METRICS_CHECK=quiet: not a value its reader takes; it says: MILES_METRICS_CHECK='quiet': "
         "expected error, warn, off"),  # after `export`
        ("guide/mlflow.md", lines[6] + 1, "MILES_ALLOW_HUB=yes: not a value its reader takes; it says: MILES_ALLOW_HUB='yes': "
         "expected 1 (download from the hub) or 0 (offline, the default)"),  # after `env`, in a shell block
    ]
    for rel, line, message in expect:
        assert f"docs/{rel}:{line}: [env] {message}" in found, (rel, line, message, found)
    assert len(found) == len(expect), found


def test_a_link_to_a_missing_page_or_anchor_is_caught(scratch, tmp_path):
    """In the docs check itself (make test), not only in mkdocs build --strict; README.md's links too."""
    page = plant(scratch, "guide/mlflow.md", "Costs: [Performance](../performance.md#tracking-overhead).",
                 "Costs: [Performance](../performance.md#tracking-overheads).")
    same = plant(scratch, "guide/mlflow.md", "[sample tables](#sample-tables)", "[sample tables](#sample-table)")
    gone = plant(scratch, "guide/concepts.md", "# ", "See [the old page](../guide/loop.md).\n\n# ")
    ref = plant(scratch, "guide/concepts.md", "# ", "See [the loop][loop] and <a href=\"../operating.md#no-such-step\">a step</a>.\n\n"
                                                 "[loop]: ../guide/loop.md#top\n\n# ")  # a reference definition, a raw HTML link
    readme = tmp_path / "README.md"
    readme.write_text("# miles\n\nSee [the metrics](docs/guide/mlflow.md#metric-and-step-axes).\n")
    found = [str(p) for p in check(scratch, readme=readme, run=()) if p.kind == "link"]
    assert f"docs/guide/mlflow.md:{page}: [link] link ../performance.md#tracking-overheads: performance.md has no heading or id " \
           "'tracking-overheads' (its ids include tracking-overhead)" in found, found
    assert any(p.startswith(f"docs/guide/mlflow.md:{same}: [link] link #sample-table: mlflow.md has no heading or id 'sample-table'")
               for p in found), found
    assert f"docs/guide/concepts.md:{gone}: [link] link target ../guide/loop.md does not exist (from concepts.md)" in found, found
    assert any(p.startswith("README.md:3: [link] link docs/guide/mlflow.md#metric-and-step-axes: mlflow.md has no heading or id")
               and "metrics-and-step-axes" in p for p in found), found
    assert f"docs/guide/concepts.md:{ref + 2}: [link] link target ../guide/loop.md does not exist (from concepts.md)" in found, found
    assert any(p.startswith(f"docs/guide/concepts.md:{ref}: [link] link ../operating.md#no-such-step: operating.md has no heading or id")
               for p in found), found
    assert len(found) == 6, found


def test_a_deployment_name_not_in_prefect_yaml_is_caught(scratch):
    """`prefect deployment run <flow>/<name>`, in a shell block or a code span, against deployments/prefect.yaml."""
    shell = plant(scratch, "operating.md", "prefect deployment run train/tiny\n", "prefect deployment run train/tiny-lorra\n")
    span = plant(scratch, "guide/mlflow.md", CHARTS, "`prefect deployment run evaluate/nightly`\n\n"
                                                    "`prefect deployment run --param target=runs/x eval/nightli`\n\n" + CHARTS)
    found = problems_of(scratch, "command")
    found = sorted(found)
    assert found[:2] == [f"docs/guide/mlflow.md:{span}: [command] prefect deployment run evaluate/nightly: no such deployment in "
                         "deployments/prefect.yaml (nearest: eval/nightly)",
                         f"docs/guide/mlflow.md:{span + 2}: [command] prefect deployment run eval/nightli: no such deployment in "
                         "deployments/prefect.yaml (nearest: eval/nightly)"], found  # the name after an option, as Prefect's CLI reads it
    # the nearest names after the first depend on which recipes exist; the closest one is the name meant
    assert len(found) == 3 and found[2].startswith(
        f"docs/operating.md:{shell}: [command] prefect deployment run train/tiny-lorra: no such deployment in "
        "deployments/prefect.yaml (nearest: train/tiny-lora"), found
    assert not problems_of(scratch, "metric"), "a deployment name is not a metric name"


def test_every_env_var_miles_reads_has_the_codes_parser_or_is_free_text():
    """A variable read anywhere in the code is parsed by the reader's own function (envvalues.parsers) or is free text
    (envvalues.ANY_TEXT); the defaults miles sets pass their parsers (Prefect's settings model for PREFECT_*)."""
    from flows import errors
    from miles_core import env, faults
    from miles_core.config.rules_events import ENV_REPORT_ENV, decode_env_report
    from miles_core.tracking import catalog
    from tools.docs import envvalues, facts

    miles_reads = {n for n, v in facts.env_vars().items() if v.read_in and not n.startswith("PREFECT_")}
    missing = sorted(miles_reads - set(envvalues.parsers()) - set(envvalues.ANY_TEXT))
    assert not missing, f"env vars read by the code without a parser in tools/docs/envvalues.py: {missing}"
    assert envvalues.parsers() == {faults.FAULT_ENV: faults.parse, catalog.CHECK_ENV: catalog.check_mode,
                                   env.ALLOW_HUB_ENV: env.allow_hub, errors.DEBUG_ENV: errors.debug_value,
                                   ENV_REPORT_ENV: decode_env_report}
    defaults = {n: v.default for n, v in facts.env_vars().items() if v.default and v.default.startswith("'")}
    bad = {n: envvalues.problem(n, d.strip("'")) for n, d in defaults.items() if envvalues.problem(n, d.strip("'"))}
    assert not bad, bad
