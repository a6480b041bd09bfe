"""A loaded config checked against the library's registries, before any model loads.

``miles_core.config`` is data: schemas and pure cross-field rules. What needs the registries above it is
checked here, once, by the CLI and the flows right after a config is loaded (or received as a flow
parameter), so a typo fails in seconds naming the field:

- rm_type (rewards' registry), custom_loss_function_path (the loss table), the multi-turn generate
  function, its parser, tool specs and execute function (rollout.multi_turn);
- every extension point, by the one resolver (registry names first, else a dotted path):
  custom_rm_path, custom_reward_post_process_path, rollout_data_postprocess_path, custom_rollout_log_function_path,
  buffer_filter_path,
  custom_eval_rollout_log_function_path, rollout_sample_filter_path, rollout_all_samples_process_path,
  dynamic_sampling_filter_path,
  custom_loss_function_path, custom_tis_function_path, eval_function_path, the Megatron plugin hooks;
- rollout_function_path (the reference's signature) and data_source_path (a class with its DataSource methods);
- the dumper's key=value pairs (dumper_inference / _fwd_only / _fwd_bwd) against SGLang's DumperConfig snapshot
  (miles_core/rollout/dumper.py check_config);
- champion_metric against the metrics catalog; with train_backend megatron, the parallel sizes against
  the model's shape (its config.json).

``load_config`` / ``build_config`` are the config loader's plus these checks; the recipes directory is
the caller's (flows/recipes.py passes deployments/recipes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from miles_core.config import ConfigError, TrainConfig
from miles_core.config import loader
from miles_core.resolve import resolve


def _loss_rule(c: TrainConfig) -> None:
    if c.algo.loss_type == "custom_loss":
        from miles_core.algorithms.losses import resolve_loss

        resolve_loss(c.algo)  # a typo, or a loss written for the reference's Megatron trainer, fails here


def _rm_type_rule(c: TrainConfig) -> None:
    if not c.rollout.custom_rm_path:
        from miles_core.rewards import validate_rm_type

        validate_rm_type(c.rollout.rm_type)


def _multi_turn_rule(c: TrainConfig) -> None:
    from miles_core.rollout.multi_turn import check_multi_turn_config

    check_multi_turn_config(c)


def _custom_rollout_rule(c: TrainConfig) -> None:
    """rollout_function_path resolves to the reference's signature (or class form); data_source_path, unless one of the
    reference's own, to a class with its DataSource methods."""
    from miles_core.config.data import REFERENCE_DATA_SOURCES
    from miles_core.rollout.custom_rollout import resolve_data_source, resolve_rollout_function

    if c.rollout.rollout_function_path is not None:
        resolve_rollout_function(c.rollout.rollout_function_path)
    if c.data.data_source_path not in REFERENCE_DATA_SOURCES:
        resolve_data_source(c.data.data_source_path)


def _model_shape_rule(c: TrainConfig) -> None:
    """heads, kv heads, layers and experts divide by the Megatron parallel sizes (when config.json is readable now)."""
    if c.cluster.train_backend != "megatron":
        return
    from miles_core.config.rules import check_model_divides
    from miles_core.models.shape import model_shape

    shape = model_shape(c.checkpoint.hf_checkpoint)
    if shape is not None:
        check_model_divides(shape, c.parallel, c.checkpoint.hf_checkpoint)
    _model_family_rule(c)


def _model_family_rule(c: TrainConfig) -> None:
    """model_name names a converter of the model's family; padded_vocab_size holds the vocab (config.json read when it
    is there now: a local dir; the trainer checks both again)."""
    import json

    from miles_core.training.megatron.model_args import FAMILIES, families_of_name, from_hf_config

    config = Path(c.checkpoint.hf_checkpoint) / "config.json"
    values = json.loads(config.read_text()) if config.is_file() else {}
    if c.checkpoint.model_name is not None:
        families_of_name(c.checkpoint.model_name)
        if values.get("model_type") in FAMILIES:
            from_hf_config(values, str(config), c.checkpoint.model_name)
    padded = c.parallel.padded_vocab_size
    if padded is not None:
        vocab = values.get("vocab_size")
        if isinstance(vocab, int) and padded < vocab:
            raise ValueError(f"padded_vocab_size ({padded}) must be >= the model's vocab_size ({vocab}, {config}); drop it "
                             "(the default pads vocab_size to a multiple of tensor_model_parallel_size)")


def _champion_metric_rule(c: TrainConfig) -> None:
    """champion_metric must name an eval metric of one of the run's eval datasets (an eval_config's are not
    known at load: then any eval dataset name passes)."""
    metric = c.checkpoint.champion_metric
    if metric is None:
        return
    from miles_core.tracking.catalog import EVAL, match

    names = (c.eval.eval_prompt_data or [])[::2]
    entry = match(metric)
    dataset = metric.split("/", 2)[1].split("-", 1)[0] if metric.count("/") >= 1 else None  # eval/<ds>[-...] -> <ds>
    known_ds = c.eval.eval_config is not None or dataset in names
    if entry is None or entry.axis != EVAL or not known_ds or not entry.name.startswith("eval/<ds>"):
        examples = ", ".join(f"eval/{n}, eval/{n}-pass@1" for n in names[:2]) or "eval/<dataset>"
        raise ValueError(f"champion_metric {metric!r} is not an eval metric of this run's datasets; e.g. {examples} "
                         "(docs/reference/metrics.md)")


def extension_points(c: TrainConfig) -> dict[str, tuple[str, Mapping[str, Callable[..., Any]] | None]]:
    """{field: (its value, the registry of names it may take)} for every extension point the config sets."""
    from miles_core.algorithms.losses import LOSS_FUNCTIONS
    from miles_core.algorithms.rollout_correction import TIS_FUNCTIONS
    from miles_core.evaluation.suite import EVAL_FUNCTIONS
    from miles_core.rollout.filters import FILTERS
    from miles_core.training.megatron.hooks import HOOKS as MEGATRON_HOOKS

    r, a, e = c.rollout, c.algo, c.eval
    points = {
        "custom_rm_path": (r.custom_rm_path, None), "custom_reward_post_process_path": (r.custom_reward_post_process_path, None),
        "rollout_data_postprocess_path": (r.rollout_data_postprocess_path, None),
        "custom_rollout_log_function_path": (r.custom_rollout_log_function_path, None),
        "buffer_filter_path": (r.buffer_filter_path, None),
        "custom_eval_rollout_log_function_path": (r.custom_eval_rollout_log_function_path, None),
        "rollout_sample_filter_path": (r.rollout_sample_filter_path, None),
        "rollout_all_samples_process_path": (r.rollout_all_samples_process_path, None),
        "dynamic_sampling_filter_path": (r.dynamic_sampling_filter_path, FILTERS),
        "custom_loss_function_path": (a.custom_loss_function_path, LOSS_FUNCTIONS),
        "custom_tis_function_path": (a.custom_tis_function_path, TIS_FUNCTIONS),
        "custom_pg_loss_reducer_function_path": (a.custom_pg_loss_reducer_function_path, None),
        "eval_function_path": (e.eval_function_path, EVAL_FUNCTIONS),
        "custom_update_weight_post_write_path": (c.cluster.custom_update_weight_post_write_path, None),
        **{name: (getattr(c.parallel, name), None) for name in MEGATRON_HOOKS},
    }
    return {k: v for k, v in points.items() if v[0]}


def _dumper_rule(c: TrainConfig) -> None:
    from miles_core.rollout.dumper import check_config
    from miles_core.training.source_patch import check_patch_file

    check_config(c)
    check_patch_file(c.misc)


def _extension_rule(c: TrainConfig) -> None:
    for field, (path, table) in extension_points(c).items():
        resolve(path, table, field)


# in the order the config's own rules used to run them (rm_type before multi-turn before extension points)
REGISTRY_RULES: tuple[Callable[[TrainConfig], None], ...] = (
    _loss_rule, _rm_type_rule, _model_shape_rule, _champion_metric_rule, _multi_turn_rule, _extension_rule,
    _custom_rollout_rule, _dumper_rule)


def check(c: TrainConfig, source: str = "config") -> TrainConfig:
    """``c`` when every registry rule passes; else ConfigError as the loader words a rule violation."""
    for rule in REGISTRY_RULES:
        try:
            rule(c)
        except ValueError as e:
            raise ConfigError(f"{source}: invalid config:\n  - config: {e}") from None
    return c


def build_config(values: Mapping[str, Any], source: str = "config") -> TrainConfig:
    """Flat values -> a config that passed the pure rules and the registry checks."""
    return check(loader.build_config(values, source), source)


def load_config(recipe: str, overrides: Mapping[str, Any] | None = None, *, recipes_dir: Path) -> TrainConfig:
    """A recipe (a name in ``recipes_dir`` or a YAML path) with overrides on top, fully checked."""
    return check(loader.load_config(recipe, overrides, recipes_dir=recipes_dir), f"recipe {recipe}")
