"""The `miles` command. `miles train <recipe>` takes every config field as a kebab-case flag."""

from __future__ import annotations

import inspect
import typing
from typing import Any, Optional

import typer
import yaml
from rich.console import Console

import flows  # noqa: F401  (configures the environment first)
from miles_core.config import GROUPS, ConfigError, list_recipes, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="miles: RL post-training as a tracked pipeline.")
console = Console()


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or (typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType")) and bool in typing.get_args(annotation))


def _is_list(annotation: Any) -> bool:
    args = typing.get_args(annotation) or (annotation,)
    return any(typing.get_origin(a) is list for a in args)


def config_options() -> list[inspect.Parameter]:
    """One keyword-only typer option per config field, documented from the field."""
    params = []
    for group, model in GROUPS.items():
        for name, field in model.model_fields.items():
            flag = "--" + name.replace("_", "-")
            help_text = f"[{group}] {field.description or ''}"
            if _is_bool(field.annotation):
                opt = typer.Option(None, f"{flag}/--no-{name.replace('_', '-')}", help=help_text, rich_help_panel=group)
                ann: Any = Optional[bool]
            else:
                opt = typer.Option(None, flag, help=help_text, rich_help_panel=group)
                ann = Optional[str]
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
    return params


def parse_overrides(raw: dict[str, Any]) -> dict[str, Any]:
    """Flag strings -> YAML scalars/lists ("8" -> 8, "[a, b]" -> list; list fields also split on spaces)."""
    fields = {n: f for m in GROUPS.values() for n, f in m.model_fields.items()}
    out = {}
    for name, value in raw.items():
        if value is None:
            continue
        if isinstance(value, str):
            parsed = yaml.safe_load(value) if value.strip() else value
            if _is_list(fields[name].annotation) and not isinstance(parsed, list):
                parsed = value.split()
            value = parsed if not (isinstance(parsed, (dict, list)) and fields[name].annotation is str) else value
        out[name] = value
    return out


RECIPE_ARG = typer.Argument(..., metavar="RECIPE", help="Recipe name (see `miles recipes`) or a YAML path.")


def _with_config_flags(name: str, help: str, fn) -> None:
    """Register ``fn`` as command ``name``: its own parameters first, then every config field as a flag."""
    own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fn.__signature__ = inspect.Signature([*own, *config_options()])
    app.command(name, help=help)(fn)


def _load_or_exit(recipe_file: str, flags: dict[str, Any]):
    try:
        return load_config(recipe_file, parse_overrides(flags))
    except ConfigError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def _train(recipe_file: str = RECIPE_ARG, **flags: Any) -> None:
    from flows.run import run_train

    run_train(_load_or_exit(recipe_file, flags), console)


_with_config_flags("train", "Train with GRPO-family RL on a recipe; any config field is a flag.", _train)


@app.command("recipes")
def recipes() -> None:
    """List the shipped recipes."""
    for name in list_recipes():
        console.print(name)


AS_PARAMS = typer.Option(False, "--as-params", help="Print {\"config\": ...} as JSON: the parameters of a train deployment "
                         "(prefect deployment run train/<recipe> --params \"$(miles config RECIPE --as-params)\").")


def _show(recipe_file: str = RECIPE_ARG, as_params: bool = AS_PARAMS, **flags: Any) -> None:
    cfg = _load_or_exit(recipe_file, flags)
    if as_params:
        import json

        typer.echo(json.dumps({"config": cfg.model_dump(mode="json")}))
        return
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


_with_config_flags("config", "Print the resolved config of a recipe with flags applied.", _show)

EVAL_TARGET = typer.Argument(..., metavar="TARGET", help="A checkpoint dir, a save dir, an HF export dir or one HF snapshot.")
EVAL_ALL = typer.Option(False, "--all", help="Every checkpoint/snapshot under TARGET not evaluated yet (default: the latest).")


def _eval(target: str = EVAL_TARGET, all_points: bool = EVAL_ALL, **flags: Any) -> None:
    from flows.evaluate import evaluate
    from flows.run import _quiet_libraries

    _quiet_libraries()
    try:
        s = evaluate(target, "all" if all_points else "latest", parse_overrides(flags))
    except (ConfigError, FileNotFoundError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    console.print(f"MLflow run        : {s['mlflow_run_id']}{'  (linked: the training run is gone)' if s['linked_run'] else ''}")
    console.print(f"evaluated         : eval/step {s['evaluated'] or 'none'}")
    console.print(f"already evaluated : eval/step {s['already_evaluated'] or 'none'}")
    if s["skipped"]:
        console.print(f"[yellow]skipped[/yellow]           : {s['skipped']}")


_with_config_flags("eval", "Evaluate checkpoints or HF snapshots into their training run's MLflow run at eval/step; "
                   "any config field is a flag over the run's own config.", _eval)


@app.command("export")
def export_cmd(
    checkpoint: str = typer.Argument(..., help="A checkpoint dir, or a save dir (its latest complete checkpoint)."),
    export_dir: str = typer.Option(..., "--export", help="Where the HF snapshot goes (<export>/<rollout_id>/)."),
    mlflow_tracking_uri: Optional[str] = typer.Option(None, help="Log and register into the checkpoint's MLflow run."),
    registered_model_name: Optional[str] = typer.Option(None, help="MLflow registered model name."),
    champion_metric: Optional[str] = typer.Option(None, help="Eval metric whose improvement moves the champion alias."),
) -> None:
    """Export a saved checkpoint as an HF snapshot (safetensors + index + config + tokenizer + .complete)."""
    from flows.export import export as export_flow

    result = export_flow(checkpoint, export_dir, mlflow_tracking_uri, registered_model_name, champion_metric)
    console.print(result)


@app.command("report")
def report_cmd(
    run_dir: str = typer.Argument(..., help="The run dir of a train run (finished or running): it holds mlflow_run.json."),
    out: Optional[str] = typer.Option(None, "--out", help="Where index.html and the PNGs go (default <run-dir>/report)."),
) -> None:
    """Write the run's plots and a one-page HTML summary (config, curves, eval table, exports, champion)."""
    from pathlib import Path

    from miles_core.tracking.report import write_report

    try:
        page = write_report(Path(run_dir).absolute(), Path(out).absolute() if out else None)
    except FileNotFoundError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    console.print(f"report: {page}")


@app.command("convert")
def convert_cmd(hf_checkpoint: str = typer.Argument(..., help="builtin://<name>, an HF directory, or a hub id.")) -> None:
    """Resolve and validate a model for the torch backend (config, weights, tokenizer, tied embeddings)."""
    from flows.convert import convert

    console.print(convert(hf_checkpoint))


@app.command("serve")
def serve_cmd(
    port: int = typer.Option(4200, help="Port of the Prefect server (and UI) on 127.0.0.1."),
    directory: Optional[str] = typer.Option(None, "--dir", help="Where pids, logs and state go (default .cache/serve)."),
    deploy: bool = typer.Option(True, help="Apply deployments/prefect.yaml (train/<recipe>, eval/nightly)."),
) -> None:
    """Start a local Prefect server and a process worker on 127.0.0.1, deploy, print the UI URL."""
    from flows.serve import serve

    try:
        info = serve(port, directory, with_deploy=deploy)
    except (RuntimeError, TimeoutError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None
    console.print(f"Prefect UI      : [bold]{info['ui']}[/bold]")
    console.print(f"API             : export PREFECT_API_URL={info['url']}")
    console.print(f"work pool       : miles (process), worker pid {info['worker_pid']}, server pid {info['server_pid']}")
    console.print(f"logs and pids   : {info['dir']}")
    console.print("launch          : prefect deployment run train/tiny   (stop with `miles stop`)")


@app.command("stop")
def stop_cmd(directory: Optional[str] = typer.Option(None, "--dir", help="The dir `miles serve` used (default .cache/serve).")) -> None:
    """Stop the worker, then the server, that `miles serve` started (SIGINT, then SIGKILL after 30 s)."""
    from flows.serve import stop

    stopped = stop(directory)
    console.print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")


@app.command("doctor")
def doctor() -> None:
    """Print versions, devices and where miles writes."""
    import os
    import platform

    import mlflow
    import prefect
    import torch
    import transformers

    from miles_core.env import cache_dir

    rows = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda available": torch.cuda.is_available(),
        "transformers": transformers.__version__, "prefect": prefect.__version__, "mlflow": mlflow.__version__,
        "cpu threads": torch.get_num_threads(), "cache dir": cache_dir(),
        "PREFECT_API_URL": os.environ.get("PREFECT_API_URL", "(unset: ephemeral API)"), "PREFECT_HOME": os.environ["PREFECT_HOME"],
        "HF_HUB_OFFLINE": os.environ["HF_HUB_OFFLINE"],
    }
    for k, v in rows.items():
        console.print(f"{k:16} {v}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
