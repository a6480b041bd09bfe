"""Shared base for the argument groups: frozen, unknown keys forbidden; ``form_first`` fields lead the
group's JSON schema (Prefect's run form), the config itself keeps its field order."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator


# Prefect's run form renders a description as HTML, where "<run_dir>" is a tag and vanishes: shown as "‹run_dir›"
FORM_BRACKETS = str.maketrans({"<": "‹", ">": "›"})


def _unset_as_empty(prop: dict[str, Any]) -> None:
    """An optional field (``X | None = None``) as its one type with no default: the form shows an empty X input where
    the anyOf would offer a "None" choice rendered as 'Property is type "None"'. The server's validation of a run's
    parameters still takes a null there: prefect.utilities.schema_tools.validation._fix_null_typing makes a property
    with a type and no default nullable. Choices (enum) keep the anyOf: a null would fail the enum."""
    branches = prop.get("anyOf", [])
    if len(branches) == 2 and {"type": "null"} in branches and prop.get("default", ...) is None:
        (typed,) = [b for b in branches if b != {"type": "null"}]
        if "type" in typed and "enum" not in typed and typed["type"] != "object":
            del prop["anyOf"], prop["default"]
            prop.update(typed)


def _form_order(schema: dict[str, Any], cls: type) -> None:
    """json_schema_extra: the properties named in ``cls.form_first`` first, in that order, then the rest; descriptions
    with angle brackets that survive the form's HTML."""
    props = schema.get("properties", {})
    for name, prop in props.items():
        if "description" in prop:
            prop["description"] = prop["description"].translate(FORM_BRACKETS)
        _unset_as_empty(prop)
    first = [k for k in getattr(cls, "form_first", ()) if k in props]
    schema["properties"] = {**{k: props[k] for k in first}, **{k: v for k, v in props.items() if k not in first}}


class Group(BaseModel):
    """One argument group. Every field keeps the reference system's name and default."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False, json_schema_extra=_form_order
    )  # allow_inf_nan=False: every float field of every group is finite (--lr inf is refused, naming lr)
    form_first: ClassVar[tuple[str, ...]] = ()  # the fields a user edits most, first in the run form

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans_as_choices(cls, data: Any) -> Any:
        """YAML reads a bare off/on/yes/no as a boolean; for a field whose choices include that word
        (async_mode: off), take the word."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if isinstance(value, bool) and field is not None and get_origin(field.annotation) is Literal:
                words = {True: ("on", "yes", "true"), False: ("off", "no", "false")}[value]
                match = [c for c in get_args(field.annotation) if isinstance(c, str) and c.lower() in words]
                if len(match) == 1:
                    out[name] = match[0]
        return out
