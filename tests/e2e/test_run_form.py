"""The run form of every deployment (its parameter schema, as `prefect deploy` sends it to the server): descriptions
as written, with no angle-bracket text an HTML render would drop."""

from __future__ import annotations

import re

import yaml

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config
from flows.serve import PREFECT_YAML

TAG = re.compile(r"<[^>]*>")


def _schemas() -> dict[str, dict]:
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    doc = yaml.safe_load(PREFECT_YAML.read_text())
    by_entry = {e: parameter_schema(load_flow_from_entrypoint(e).fn).model_dump() for e in {d["entrypoint"] for d in doc["deployments"]}}
    return {d["name"]: by_entry[d["entrypoint"]] for d in doc["deployments"]}


def _descriptions(node):
    if isinstance(node, dict):
        if isinstance(node.get("description"), str):
            yield node["description"]
        for v in node.values():
            yield from _descriptions(v)
    elif isinstance(node, list):
        for v in node:
            yield from _descriptions(v)


def test_no_description_of_any_deployment_loses_text_to_html():
    schemas = _schemas()
    assert {"tiny", "glm4-5", "nightly"} <= set(schemas)
    for name, schema in schemas.items():
        lost = [d for d in _descriptions(schema) if TAG.search(d)]
        assert not lost, f"{name}: descriptions the form would mangle: {lost[:3]}"
    run_dir = schemas["tiny"]["definitions"]["MiscConfig"]["properties"]["run_dir"]["description"]
    assert "‹recipe›" in run_dir  # reworded, not dropped


def _properties(schema: dict):
    for group, definition in schema.get("definitions", {}).items():
        for name, prop in definition.get("properties", {}).items():
            yield f"{group}.{name}", prop


def test_every_deployments_defaults_pass_the_servers_validation_of_its_form():
    """What the server runs with enforce_parameter_schema: on `prefect deploy` (DeploymentCreate in
    prefect/server/schemas/actions.py: prefect._internal.schemas.validators.validate_values_conform_to_schema, no
    property made nullable), and on a flow run of the deployment (prefect/server/api/deployments.py:
    prefect.utilities.schema_tools.validate, where a typed property with no default takes a null)."""
    from prefect._internal.schemas.validators import validate_values_conform_to_schema
    from prefect.utilities.schema_tools.validation import validate

    doc = yaml.safe_load(PREFECT_YAML.read_text())
    schemas = _schemas()
    for d in doc["deployments"]:
        validate_values_conform_to_schema(d["parameters"], schemas[d["name"]], ignore_required=True)
        errors = validate(d["parameters"], schemas[d["name"]], raise_on_error=False)
        assert not errors, f"{d['name']}: {[e.message for e in errors][:3]}"
    # a run whose parameters hold every field, the unset ones as null (`prefect deployment run --params` of a full
    # config), passes the flow run's check
    full = {"config": load_config("tiny").model_dump(mode="json")}
    assert full["config"]["checkpoint"]["ref_load"] is None
    assert not validate(full, schemas["tiny"], raise_on_error=False)


def test_every_field_and_group_of_every_deployments_form_says_what_it_is():
    """No property whose only help is its type: every flow parameter, group and field has a description (the group's
    class docstring heads its section), and an optional field is an empty input of its type, not a choice the form
    renders as 'Property is type "None"' (choices, multi-type unions and a None that is not the default keep the
    branch: a null there needs it)."""
    for name, schema in _schemas().items():
        bare = [f"top.{k}" for k, p in schema["properties"].items() if not p.get("description", "").strip()]
        bare += [g for g, d in schema.get("definitions", {}).items() if not d.get("description", "").strip()]
        bare += [k for k, p in _properties(schema) if not p.get("description", "").strip()]
        assert not bare, f"{name}: fields with no help but their type: {bare[:5]}"
        none_choice = [k for k, p in _properties(schema) if {"type": "null"} in p.get("anyOf", [])
                       and len(p["anyOf"]) == 2 and not any("enum" in b for b in p["anyOf"]) and p.get("default") is None]
        assert not none_choice, f"{name}: optional fields offered as a 'None' choice: {none_choice[:5]}"
    tiny = _schemas()["tiny"]["definitions"]
    assert tiny["CheckpointConfig"]["properties"]["ref_load"]["type"] == "string"  # an empty text input, no default
    assert "default" not in tiny["CheckpointConfig"]["properties"]["ref_load"]
