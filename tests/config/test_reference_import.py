"""`miles recipe import` (miles_core/reference_import.py): a reference launch command as a recipe, over the reference's
own GLM-4.5 model page and 8-node launcher command (tests/config/data/reference_import/, sources cited there)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.recipe_import import import_command
from flows.recipes import load_config, read_recipe
from miles_core import reference_import as ri

DATA = Path(__file__).parent / "data" / "reference_import"
PAGE, LAUNCHER = DATA / "glm4-5_page.sh", DATA / "run_glm45_355b_a32b_8node.cmd"
runner = CliRunner()


def _import(tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    out = tmp_path / "imported.yaml"
    result = runner.invoke(app, ["recipe", "import", "-o", str(out), *args])
    return result.exit_code, result.output, out


def _resolved(recipe: str | Path) -> dict:
    cfg = load_config(str(recipe))
    flat = {k: v for g in type(cfg).model_fields for k, v in getattr(cfg, g).model_dump(mode="json").items()}
    flat.update({f"sglang_{k}": v for k, v in flat.pop("sglang_server_args").items()})
    return flat


def test_glm45_page_needs_allow_refused_and_names_each_reason(tmp_path):
    code, output, out = _import(tmp_path, "--base", "glm4-5", "--from-file", str(PAGE))
    assert code == 2 and not out.exists()
    refused = [line for line in output.splitlines() if line.startswith("refused: ")]
    # the page's CP 2, DeepEP dispatch and CPU Adam: what the shipped recipe's header says it leaves out
    assert [r.split(":")[1].strip().split()[0] for r in refused] == [
        "--moe-enable-deepep", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer",
        "--moe-token-dispatcher-type", "--context-parallel-size"]
    assert "context_parallel_size 2 is not supported yet" in output and "DeepEP is not supported" in output


def test_glm45_page_agrees_with_the_shipped_recipe(tmp_path):
    """Every value the page sets is the shipped glm4-5 recipe's: over that base, the import writes no value at all, and
    the imported recipe validates and resolves to the same config."""
    code, output, out = _import(tmp_path, "--base", "glm4-5", "--allow-refused", "--from-file", str(PAGE))
    assert code == 0, output
    imported = import_command(ri.shell_argv(PAGE.read_text()), "glm4-5")
    assert imported.model_spec == "glm4.5-355B-A32B"
    shipped = read_recipe("glm4-5")
    page_keys = set(imported.values)
    assert {"tensor_model_parallel_size", "sglang_attn_dp_size", "sglang_speculative_algorithm", "eps_clip"} <= page_keys
    assert {k: imported.values[k] for k in page_keys} == {k: shipped[k] for k in page_keys}
    assert imported.written == {}
    body = yaml.safe_load(out.read_text())
    assert body == {"extends": "glm4-5"}
    assert _resolved(out) == {**_resolved("glm4-5"), "recipe": "imported"}


# values the launcher's printed command sets otherwise than the shipped recipe, and why (the recipe points at hub ids
# and /data; the launcher at its /root dirs)
LOCAL_PATHS = {"hf_checkpoint", "prompt_data", "eval_prompt_data"}


def test_glm45_launcher_command_without_base_equals_the_shipped_recipe_where_both_set(tmp_path):
    code, output, out = _import(tmp_path, "--allow-refused", "--from-file", str(LAUNCHER))
    assert code == 0, output
    written = yaml.safe_load(out.read_text())
    resolved, shipped = _resolved(out), _resolved("glm4-5")
    recipe_keys = set(read_recipe("glm4-5")) - {"recipe"}
    both = (set(written) & recipe_keys) - LOCAL_PATHS
    assert len(both) >= 45, sorted(both)
    assert {k: resolved[k] for k in both} == {k: shipped[k] for k in both}
    assert {k: (resolved[k], shipped[k]) for k in LOCAL_PATHS if resolved[k] == shipped[k]} == {}  # the list is not stale
    # every refused flag is a comment naming its reason
    comments = [line for line in out.read_text().splitlines() if line.startswith("# --")]
    assert any(c.startswith("# --sequence-parallel  -- sequence_parallel is not supported yet") for c in comments)
    assert any(c.startswith("# --attention-backend flash  -- ") for c in comments)


def test_unknown_flag_fails_naming_the_nearest(tmp_path):
    code, output, out = _import(tmp_path, "--", "--rollout-batch-size", "8", "--rollout-batchsize", "4")
    assert code == 2 and not out.exists()
    assert "unknown flag --rollout-batchsize" in output and "nearest known flag is --rollout-batch-size" in output


def test_refused_flag_fails_naming_its_reason_from_the_compat_table(tmp_path):
    from miles_core.config.reference_flags import refusal
    from tools.docs.compat import fields

    code, output, _ = _import(tmp_path, "--", "--prompt-data", "builtin://arith", "--rollout-batch-size", "2",
                              "--n-samples-per-prompt", "2", "--use-session-server")
    assert code == 2
    assert f"refused: --use-session-server: {refusal('use_session_server', fields())}" in output


def test_given_twice_last_wins_and_says_so(tmp_path):
    code, output, out = _import(tmp_path, "--base", "tiny", "--", "--lr", "1e-5", "--lr", "3e-5")
    assert code == 0, output
    assert "--lr is given twice: the last value (3e-5) wins" in output
    assert yaml.safe_load(out.read_text())["lr"] == 3e-5
    assert load_config(str(out)).algo.lr == 3e-5


def test_only_differences_from_the_base_are_written(tmp_path):
    base = read_recipe("tiny")
    same = ["--rollout-batch-size", str(base["rollout_batch_size"])]
    code, output, out = _import(tmp_path, "--base", "tiny", "--", *same, "--eps-clip", "0.3", "--colocate")
    assert code == 0, output
    assert yaml.safe_load(out.read_text()) == {"extends": "tiny", "eps_clip": 0.3, "colocate": True}


def test_store_false_flags_set_our_same_named_field(tmp_path):
    """--disable-grpo-std-normalization is a store_false flag of the reference (its dest is the inverse name); our field has
    the flag's own name, so given means true."""
    code, output, out = _import(tmp_path, "--base", "tiny", "--", "--disable-grpo-std-normalization")
    assert code == 0, output
    assert load_config(str(out)).algo.disable_grpo_std_normalization is True


def test_model_args_that_match_no_named_spec_are_refused(tmp_path):
    flags = [t for f in ri.margs.reference_flags("qwen3-4B") for t in f.split()]
    flags[flags.index("--num-layers") + 1] = "37"
    code, output, _ = _import(tmp_path, "--base", "tiny", "--", *flags)
    assert code == 2
    assert "match no named spec (nearest qwen3-4B, differing in --num-layers)" in output


def test_model_args_from_a_script_array_and_the_model_option(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('source "scripts/models/qwen3-4B.sh"\nCKPT_ARGS=(\n   --lr 2e-6  # a comment\n   --seed 7\n)\n'
                      'cd /root/miles\nray job submit -- python3 train.py \\\n   ${MODEL_ARGS[@]} \\\n   "${CKPT_ARGS[@]}"\n')
    argv = ri.shell_argv(script.read_text())
    assert argv[-4:] == ["--lr", "2e-6", "--seed", "7"]
    imported = ri.classify(argv)
    assert imported.model_spec == "qwen3-4B" and imported.values == {"lr": 2e-6, "seed": 7} and not imported.refused
    with pytest.raises(ri.ImportFailure, match="MODEL_ARGS is not defined"):
        ri.expand(["${MODEL_ARGS[@]}"], {})
    code, output, _ = _import(tmp_path, "--model", "qwen9", "--", "${MODEL_ARGS[@]}")
    assert code == 2 and "unknown model spec 'qwen9'" in output


def test_secrets_are_never_echoed(tmp_path):
    code, output, out = _import(tmp_path, "--base", "tiny", "--allow-refused", "--", "--wandb-key", "s3cret")
    assert code == 0, output
    assert "s3cret" not in output and "s3cret" not in out.read_text()


def test_values_are_read_with_the_references_types():
    """int / float / json.loads as flags.tsv types them; a list flag takes every value up to the next flag."""
    imported = ri.classify(["--apply-chat-template-kwargs", '{"enable_thinking": false}', "--rollout-top-k", "-1",
                            "--eps-clip", "1e-4", "--rollout-stop-token-ids", "1", "2", "--input-key", "1"])
    assert imported.values == {"apply_chat_template_kwargs": {"enable_thinking": False}, "rollout_top_k": -1, "eps_clip": 1e-4,
                               "rollout_stop_token_ids": [1, 2], "input_key": "1"}
    with pytest.raises(ri.ImportFailure, match="--use-tis is a switch"):
        ri.classify(["--use-tis", "true"])


def test_a_base_given_as_a_path_is_extended_from_where_the_recipe_is_written(tmp_path):
    (tmp_path / "bases").mkdir()
    base = tmp_path / "bases" / "mine.yaml"
    base.write_text("extends: tiny\neps_clip: 0.25\n")
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "imported.yaml"
    result = runner.invoke(app, ["recipe", "import", "--base", str(base), "-o", str(out), "--", "--lr", "2e-5"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["extends"] == "../bases/mine.yaml"
    cfg = load_config(str(out))
    assert (cfg.algo.eps_clip, cfg.algo.lr) == (0.25, 2e-5)
