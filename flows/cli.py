"""The `miles` command. `miles train <recipe>` takes every config field as a kebab-case flag."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import typing
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.console import Console

import flows  # noqa: F401  (configures the environment first)
from miles_core.config import GROUPS
from flows.recipes import list_recipes, load_config

from .errors import DEBUG_ENV, debug_enabled, describe, exit_code

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="miles: RL post-training as a tracked pipeline.")
console = Console()


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help=f"Print full tracebacks (same as {DEBUG_ENV}=1).")) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"


@contextlib.contextmanager
def _one_message(dirs: dict[str, Path] | None = None):
    """An error inside -> one short message (flows/errors.py) and exit 2 (input) or 1; the traceback only in debug mode."""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as e:
        if debug_enabled():
            raise
        for line in describe(e, dirs):
            console.print(line, markup=False, highlight=False, soft_wrap=True, style="red" if line.startswith("error") else None)
        raise typer.Exit(exit_code(e)) from None


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or (typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType")) and bool in typing.get_args(annotation))


def _is_list(annotation: Any) -> bool:
    """list[X] itself, or a union holding one (list[X] | None)."""
    return any(typing.get_origin(a) is list for a in (annotation, *typing.get_args(annotation)))


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
        if name not in fields:  # an SGLang passthrough (sglang_<server argument>), already typed by _passthrough
            out[name] = value
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
    """Register ``fn`` as command ``name``: its own parameters first, then every config field as a flag,
    then SGLang passthrough flags (``--sglang-<server argument> [value]``, any number, after the recipe)."""
    hints = typing.get_type_hints(fn)  # the wrapper below has none of fn's annotations: give typer the real types
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)

    def command(ctx: typer.Context, **kwargs: Any) -> None:
        return fn(**kwargs, **_passthrough(ctx.args))

    command.__signature__ = inspect.Signature([ctx_param, *own, *config_options()])
    command.__doc__ = fn.__doc__
    help += " SGLang server arguments (rollout_engine sglang): --sglang-<flag> VALUE (a switch: no VALUE), after the recipe."
    app.command(name, help=help, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(command)


def _passthrough(args: list[str]) -> dict[str, Any]:
    """``--sglang-mem-fraction-static 0.7 --sglang-enable-metrics`` -> {"sglang_mem_fraction_static": 0.7, ...},
    read as SGLang's argparse reads them (miles_core/config/server_args.py). Anything else is an error."""
    if not args:
        return {}
    from miles_core.config.server_args import PassthroughError, parse_cli

    try:
        return {f"sglang_{k}": v for k, v in parse_cli(args).items()}
    except PassthroughError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def _load_or_exit(recipe_file: str, flags: dict[str, Any]):
    with _one_message():
        return load_config(recipe_file, parse_overrides(flags))


def _train(recipe_file: str = RECIPE_ARG, **flags: Any) -> None:
    from flows.run import run_train
    from miles_core import runlock
    from miles_core.preflight import preflight

    cfg = _load_or_exit(recipe_file, flags)
    with _one_message({"run_dir": cfg.run_dir, "save": cfg.save_dir, "export": cfg.export_dir}):
        preflight(cfg)  # inputs, outputs, devices: before Prefect starts or any model loads
        runlock.probe(cfg)  # another run on these dirs: refused now (the flow holds the lock)
        from flows.interrupt import start_own_session_api

        api = start_own_session_api()  # Prefect's ephemeral API (unless one is configured): it answers in seconds
        from flows.tracking import check_resume_early  # here: MLflow's import is not paid by the refusals above

        check_resume_early(cfg)  # a resume with changed params: refused before a progress bar shows
        run_train(cfg, console, api)


_with_config_flags("train", "Train with GRPO-family RL on a recipe; any config field is a flag.", _train)


@app.command("recipes")
def recipes(validate: bool = typer.Option(False, "--validate", help="Load and validate each recipe (as `miles config` "
                                          "does, in one process); exit 2 naming the first that fails.")) -> None:
    """List the shipped recipes."""
    for name in list_recipes():
        if validate:
            with _one_message():
                load_config(name)
            console.print(f"{name}  ok", markup=False, highlight=False)
        else:
            console.print(name)


@app.command("recipe")
def recipe_cmd(
    args: list[str] = typer.Argument(..., metavar="import -- [REFERENCE FLAGS...]", help="`import`, then (after `--`) the "
                                     "reference's train.py flags, as its launch commands write them."),
    out: str = typer.Option(..., "-o", "--out", help="The recipe YAML to write."),
    base: Optional[str] = typer.Option(None, "--base", help="Recipe the import extends (`extends: BASE`): only values that "
                                       "differ from it are written (default: only values that differ from miles' defaults)."),
    from_file: Optional[str] = typer.Option(None, "--from-file", help="Read the flags from a launch script or a flags file "
                                            "(shell style: \\ continuations, comments, NAME=( ... ) arrays, ${NAME[@]})."),
    model: Optional[str] = typer.Option(None, "--model", help="The named model spec ${MODEL_ARGS[@]} stands for (see `miles "
                                        "model-args`); default: the script's `source scripts/models/<name>.sh` line."),
    allow_refused: bool = typer.Option(False, "--allow-refused", help="Write the recipe even though some flags cannot be "
                                       "honoured: they become comments with their reasons (default: exit 2 listing them)."),
) -> None:
    """Import a reference launch command as a recipe: each flag mapped to a field (or refused with its reason)."""
    from flows.recipe_import import run_import

    if args[0] != "import":
        console.print(f"[red]error:[/red] miles recipe takes `import`; got {args[0]!r}")
        raise typer.Exit(2)
    with _one_message():
        code = run_import(args[1:], out=Path(out), base=base, from_file=from_file, model=model, allow_refused=allow_refused,
                          echo=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    raise typer.Exit(code)


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

EVAL_TARGET = typer.Argument(..., metavar="TARGET", help="A checkpoint dir, a save dir, an HF export dir, one HF snapshot "
                             "or a run dir (its checkpoints/).")
EVAL_ALL = typer.Option(False, "--all", help="Every checkpoint/snapshot under TARGET not evaluated yet (default: the latest).")


def _eval(target: str = EVAL_TARGET, all_points: bool = EVAL_ALL, **flags: Any) -> None:
    from flows.eval_target import precheck

    with _one_message():
        target = str(precheck(target))  # before Prefect or torch import: a bad path is refused in about a second
        overrides = parse_overrides(flags)
    from flows.evaluate import evaluate
    from flows.run import _quiet_libraries

    _quiet_libraries()
    with _one_message():
        s = evaluate(target, "all" if all_points else "latest", overrides)
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

    with _one_message():
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

    with _one_message():  # a dir without a run: one message, exit 2
        page = write_report(Path(run_dir).absolute(), Path(out).absolute() if out else None)
    console.print(f"report: {page}")


@app.command("dashboard")
def dashboard_cmd(
    run_dir: str = typer.Argument(..., help="The run dir of a train run with use_miles_dashboard (finished or running)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (0.0.0.0 to expose it beyond this machine)."),
    port: int = typer.Option(7788, "--port", help="Port (0: a free one, printed)."),
) -> None:
    """Serve the run's dashboard telemetry (<run-dir>/dashboard/) as JSON over HTTP until interrupted."""
    from pathlib import Path

    from miles_core.tracking.dashboard.server import make_server

    with _one_message():  # a run dir without a dashboard: one message, exit 2
        server = make_server(Path(run_dir).absolute(), host, port)
    console.print(f"dashboard of {run_dir}: http://{host}:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass  # Ctrl-C is how this command ends
    finally:
        server.server_close()


CONVERSIONS = ("hf-to-torch-dist", "torch-dist-to-hf")


@app.command("convert")
def convert_cmd(
    args: list[str] = typer.Argument(..., metavar="[MODE] SOURCE [OUT]", help="HF_CHECKPOINT (builtin://<name>, an HF "
                                     "directory or a hub id: resolve and validate it for the torch backend), or "
                                     "hf-to-torch-dist HF_DIR OUT, or torch-dist-to-hf TORCH_DIST_DIR OUT."),
    config: Optional[str] = typer.Option(None, "--config", help="torch-dist-to-hf: the HF config.json (or its dir) the "
                                         "checkpoint must match (default the checkpoint's own)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="torch-dist-to-hf: copy this dir's tokenizer files."),
) -> None:
    """Resolve and validate a model for the torch backend, or convert HF <-> torch_dist (the Megatron backend's format)."""
    if args[0] not in CONVERSIONS:
        if len(args) != 1:
            console.print(f"[red]error:[/red] expected one HF_CHECKPOINT or a mode of {CONVERSIONS}; got {args}")
            raise typer.Exit(2)
        from flows.convert import convert

        with _one_message():
            console.print(convert(args[0]))
        return
    if len(args) != 3:
        console.print(f"[red]error:[/red] miles convert {args[0]} takes SOURCE OUT; got {args[1:]}")
        raise typer.Exit(2)
    from miles_core.checkpoint.hf_load import check_hf_weights

    try:
        if args[0] == "hf-to-torch-dist":
            check_hf_weights(Path(args[1]))  # headers vs config.json: seconds, before megatron is even imported
        from miles_core.training.megatron import convert as mconvert

        if args[0] == "hf-to-torch-dist":
            summary = mconvert.hf_to_torch_dist(args[1], args[2])
        else:
            summary = mconvert.torch_dist_to_hf(args[1], args[2], config, tokenizer)
    except (ValueError, OSError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None
    console.print(summary)


@app.command("model-args")
def model_args_cmd(
    name: str = typer.Argument(..., help="A named model spec (glm4.5-355B-A32B, qwen3-8B, ...)."),
    config: Optional[str] = typer.Option(None, "--config", help="Check the spec against this config.json (or HF dir) first."),
) -> None:
    """Print a named model spec as Megatron-LM flags (the reference's MODEL_ARGS), one per line."""
    import json
    from pathlib import Path

    from miles_core.training.megatron.model_args import check_named, named, reference_flags

    try:
        if config is None:
            named(name)  # an unknown name is refused, listing the valid ones
        else:
            path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
            check_named(name, json.loads(path.read_text()), str(path))
    except (ValueError, OSError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None
    typer.echo("\n".join(reference_flags(name)))


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
        "HF_HUB_OFFLINE": os.environ["HF_HUB_OFFLINE"], "sglang": _sglang_status(),
    }
    for k, v in rows.items():
        console.print(f"{k:16} {v}", markup=False)  # values may hold brackets (an extra: miles[sglang])


def _sglang_status() -> str:
    """The installed SGLang's version against the pinned one (read from its metadata: nothing is imported)."""
    import importlib.metadata

    from miles_core.rollout.sglang import SGLANG_VERSION

    try:
        found = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return f"not installed (rollout_engine sglang needs {SGLANG_VERSION}: pip install 'miles[sglang]')"
    return found if found == SGLANG_VERSION else f"{found} (rollout_engine sglang needs {SGLANG_VERSION})"


def main() -> None:
    """The `miles` command: exits as soon as the exit handlers have run, skipping the interpreter's teardown of
    torch and the rest (flows/run.py ``_exit_now``). In-process callers (typer's CliRunner) call ``app``."""
    from flows.run import _exit_now

    try:
        app()
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    if not isinstance(code, int):  # sys.exit("message") prints the message and exits 1, as the interpreter does
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    _exit_now(code, join_threads=True)


if __name__ == "__main__":
    main()
