"""Recipes (YAML, flat reference names) + overrides -> a validated TrainConfig.

A recipe is a flat mapping of field names (``rollout_batch_size: 8``); the grouped form
(``rollout: {rollout_batch_size: 8}``) is accepted too. Overrides use the same names.
A key ``sglang_<server argument>`` that is no config field is an SGLang passthrough, collected into
``sglang_server_args`` (config/sglang.py); a recipe that sets ``sglang_server_args`` itself replaces
the passthroughs it inherits (``sglang_server_args: {}`` drops them). ``extends: <recipe>`` (a recipe name, or a YAML path relative to the file) starts from that
recipe's values and sets this file's on top: how a scale variant (``glm4-5-debug``) shares its
recipe's settings (docs/operating.md).

Where recipe names are looked up (``recipes_dir``) is the caller's: the config package lies below the
project's deployments/ (flows/recipes.py passes deployments/recipes). Only the pure rules run here; the
registry checks are miles_core/assemble.py's.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from .reference_flags import ALIASES, refusal
from .train import GROUPS, TrainConfig

SGLANG_PREFIX = "sglang_"  # a key sglang_<server argument> that is no field: an SGLang passthrough (config/sglang.py)


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field, the value and the fix."""


def field_groups() -> dict[str, str]:
    """Flat field name -> group name. Names are unique across groups (tested)."""
    return {name: g for g, model in GROUPS.items() for name in model.model_fields}


def list_recipes(recipes_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(recipes_dir).glob("*.yaml"))


def recipe_path(recipe: str, recipes_dir: Path) -> Path:
    p = Path(recipe)
    if p.is_dir():
        raise ConfigError(f"recipe {recipe} is a directory; expected a recipe name or a YAML file")
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    p = Path(recipes_dir) / f"{recipe}.yaml"
    if not p.exists():
        raise ConfigError(f"unknown recipe {recipe!r}: not a YAML file and not one of {list_recipes(recipes_dir)}")
    return p


def read_recipe(recipe: str, recipes_dir: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe's flat values, its ``extends`` chain applied (a base is a YAML path next to it or a name in ``recipes_dir``)."""
    path = recipe_path(recipe, recipes_dir)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"recipe {path}:{line}: not UTF-8 (byte {raw[e.start]:#04x})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: expected a mapping of field names, got {type(data).__name__}")
    data.setdefault("recipe", path.stem)
    base = data.pop("extends", None)
    values = _flatten(data, source=str(path))
    if base is None:
        return values
    if path.resolve() in _chain:
        raise ConfigError(f"recipe {path}: extends cycle {' -> '.join(p.stem for p in (*_chain, path.resolve()))}")
    relative = path.parent / str(base)
    parent = read_recipe(str(relative) if relative.suffix in (".yaml", ".yml") and relative.exists() else str(base),
                         recipes_dir, (*_chain, path.resolve()))
    if "sglang_server_args" in values:  # the whole passthrough set: replaces every sglang_* key the parent has
        groups = field_groups()
        parent = {k: v for k, v in parent.items() if not (k.startswith(SGLANG_PREFIX) and k not in groups)}
    return {**parent, **values}


def _flatten(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"{source}: key {key!r} is not a string ({type(key).__name__}); config keys are field names")
        if key in GROUPS and isinstance(value, Mapping):
            out.update(_flatten(value, source))
        else:
            out[key.replace("-", "_")] = value
    return out


def build_config(values: Mapping[str, Any], source: str = "config") -> TrainConfig:
    """Group flat values and validate. Unknown keys and rule violations raise ConfigError."""
    groups = field_groups()
    nested: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    passthrough: dict[str, Any] = {}
    for key, value in _flatten(values, source).items():
        key = ALIASES.get(key, key)  # the reference's name of one of our fields (save_hf -> export)
        if key not in groups and key.startswith(SGLANG_PREFIX):
            passthrough[key.removeprefix(SGLANG_PREFIX)] = value  # checked by SglangConfig against the snapshot
            continue
        if key not in groups and (why := refusal(key, frozenset(groups))):
            raise ConfigError(f"{source}: {why}")
        if key not in groups:
            close = difflib.get_close_matches(key, groups, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{source}: unknown config key {key!r}{hint}")
        nested[groups[key]][key] = value
    if passthrough:
        nested["sglang"]["sglang_server_args"] = {**nested["sglang"].get("sglang_server_args", {}), **passthrough}
    try:
        return TrainConfig.model_validate(nested)
    except ValidationError as e:
        raise ConfigError(f"{source}: invalid config:\n{_explain(e)}") from None


def _explain(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = [str(p) for p in err["loc"] if str(p) not in GROUPS]
        field = ".".join(loc) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        got = f" (got {err['input']!r})" if loc and "input" in err and not isinstance(err["input"], dict) else ""
        lines.append(f"  - {field}: {msg}{got}")
    return "\n".join(lines)


def load_config(recipe: str, overrides: Mapping[str, Any] | None = None, *, recipes_dir: Path) -> TrainConfig:
    """Read a recipe (a name in ``recipes_dir`` or a YAML path) and apply overrides on top (pure rules only)."""
    values = read_recipe(recipe, recipes_dir)
    values.update({k.replace("-", "_"): v for k, v in (overrides or {}).items()})
    return build_config(values, source=f"recipe {recipe}")
