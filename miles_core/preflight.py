"""Checks at run start, before any model loads: what config validation cannot see (files, directories,
devices, the environment). The CLI calls ``preflight`` before the flow starts and the train flow calls
it first, so a bad input fails in about a second with one message naming the field and the path.

- inputs: ``prompt_data`` and every eval dataset is a readable UTF-8 jsonl (or parquet) file whose rows
  have the keys and types the run needs (1-based lines); ``eval_config`` is a file; ``hf_checkpoint``,
  ``ref_load`` and ``opd_teacher_load`` given as paths are directories; an explicit ``load`` other than
  the save dir exists and holds checkpoints (a mistyped ``--load`` never starts from scratch silently);
- outputs: the run, save and export dirs are directories (not files), can be created and written, and
  have ``MIN_FREE_BYTES`` free, or 3x the initial weights when they are a local directory (model plus
  the two AdamW moments of a checkpoint);
- the optional install a backend value needs (sglang), ``device`` (cuda needs a CUDA device; a part that
  cannot run on a GPU yet is refused by name, ``check_gpu_supported``), and a well-formed ``MILES_FAULT_INJECT``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from miles_core.config import ConfigError, TrainConfig
from miles_core.config.rules_profile import NO_CUDA_HISTORY
from miles_core.data import DataError, PromptSpec, check_rows
from miles_core.data.dataset import split_slice

MIN_FREE_BYTES = 256 * 1024**2
BUILTIN = "builtin://"
# (field, value) -> why no runtime honours it yet; the default of each field is honoured.


class PreflightError(ConfigError):
    """An input or output of a run that cannot work; the message names the field and the path."""


def preflight(cfg: TrainConfig) -> None:
    """Raise PreflightError for the first problem found (see the module docstring)."""
    for check in (_backend_installed, _device, _fault_spec, _inputs, _outputs):
        check(cfg)


def _backend_installed(cfg: TrainConfig) -> None:
    """rollout_engine sglang needs the optional sglang install (validating such a recipe does not), unless the
    engines are external (rollout_external_engine_addrs: nothing is launched)."""
    if cfg.cluster.rollout_engine == "sglang" and not cfg.rollout.external_engines:
        from miles_core.rollout.sglang.launch import SGLangNotInstalled, require_sglang

        try:
            require_sglang(cfg)
        except SGLangNotInstalled as e:
            raise PreflightError(f"rollout_engine: {e}") from None


def _device(cfg: TrainConfig) -> None:
    """``device`` resolved here (miles_core/device.py): cuda without a CUDA device fails before any model loads. A
    Ray cluster given by ray_address has its own GPUs: the Ray placement checks them (runtime/ray/cluster.py)."""
    if cfg.cluster.device == "cpu" or (cfg.cluster.runtime == "ray" and cfg.cluster.ray_address):
        return
    from miles_core.device import DeviceUnavailable, resolve_device

    try:
        device = resolve_device(cfg.cluster.device)
    except DeviceUnavailable as e:
        raise PreflightError(str(e)) from None
    if device.type == "cuda":
        check_gpu_supported(cfg)
    elif cfg.misc.record_memory_history:
        raise PreflightError(f"record_memory_history with device {cfg.cluster.device}, which is cpu here (torch sees no CUDA "
                             f"device): {NO_CUDA_HISTORY}; run it on a GPU machine, or drop record_memory_history")


def check_gpu_supported(cfg: TrainConfig) -> None:
    """Raise PreflightError naming the fields when a part of a run that goes on a GPU cannot run there yet."""
    if cfg.cluster.colocate and cfg.cluster.weight_sync_mode == "broadcast":
        raise PreflightError(f"device: {cfg.cluster.device} with colocate puts a train rank and its engine on one GPU, where "
                             "update_weight_mode: broadcast (NCCL) cannot run (NCCL refuses two ranks on one device); set "
                             "update_weight_mode: tensor or disk")


def _fault_spec(cfg: TrainConfig) -> None:
    from miles_core import faults

    try:
        faults.check()
    except ValueError as e:
        raise PreflightError(str(e)) from None


# ---- inputs -------------------------------------------------------------------------------------
def _inputs(cfg: TrainConfig) -> None:
    ck = cfg.checkpoint
    _check_data("prompt_data", cfg.data.prompt_data, _run_keys(cfg))
    if cfg.eval.eval_config and not Path(cfg.eval.eval_config).is_file():
        raise PreflightError(f"eval_config {cfg.eval.eval_config}: no such file" + _dir_hint(Path(cfg.eval.eval_config)))
    for name, path, spec in _eval_data(cfg):
        _check_data(f"eval dataset {name}", path, spec)
    for field in ("hf_checkpoint", "ref_load"):
        _check_model_dir(field, getattr(ck, field))
    _check_model_dir("opd_teacher_load", cfg.algo.opd_teacher_load)
    _check_load(cfg)


def _eval_data(cfg: TrainConfig) -> list[tuple[str, str, PromptSpec]]:
    """(name, path, row keys) of each eval dataset. eval_prompt_data pairs use the run's keys; an eval_config
    is resolved by the eval package (which imports torch: only then)."""
    d = cfg.data
    if cfg.eval.eval_config:
        from miles_core.evaluation.spec import resolve_datasets

        return [(ds.name, ds.path, PromptSpec(input_key=ds.input_key, label_key=ds.label_key, metadata_key=ds.metadata_key,
                                             tool_key=ds.tool_key, apply_chat_template=d.apply_chat_template))
                for ds in resolve_datasets(cfg)]
    pairs = cfg.eval.eval_prompt_data or []
    return [(name, path, _run_keys(cfg)) for name, path in zip(pairs[::2], pairs[1::2])]


def _run_keys(cfg: TrainConfig) -> PromptSpec:
    d = cfg.data
    return PromptSpec(input_key=d.input_key, label_key=d.label_key, metadata_key=d.metadata_key, tool_key=d.tool_key,
                      apply_chat_template=d.apply_chat_template)


def _check_data(field: str, spec: str | None, prompt_spec: PromptSpec) -> None:
    if spec is None or spec.startswith(BUILTIN):
        return
    try:
        check_rows(spec, prompt_spec)
    except DataError as e:
        raise PreflightError(f"{field}: {e}") from None
    except OSError as e:
        raise PreflightError(f"{field}: cannot read {split_slice(spec)[0]}: {e.strerror}") from None


def _dir_hint(path: Path) -> str:
    return " (it is a directory)" if path.is_dir() else ""


def _check_model_dir(field: str, spec: str | None) -> None:
    """A path-like model (absolute, relative with ./, or existing) must be a directory with config.json."""
    if spec is None or spec.startswith(BUILTIN):
        return
    path = Path(spec)
    if not (path.exists() or spec.startswith((".", "/")) or spec.count("/") != 1):
        return  # a hub id (org/name), resolved later
    if not path.is_dir():
        raise PreflightError(f"{field} {spec}: " + ("is a file; expected an HF model directory" if path.exists() else "no such directory"))
    if not (path / "config.json").is_file():
        raise PreflightError(f"{field} {spec}: directory has no config.json (not an HF model directory)")


def _check_load(cfg: TrainConfig) -> None:
    load = cfg.checkpoint.load
    if load is None or cfg.load_dir == cfg.save_dir:
        return  # load defaults to save: missing means a fresh start
    path = cfg.load_dir
    if not path.is_dir():
        raise PreflightError(f"load {load}: " + ("is a file" if path.exists() else "no such directory")
                             + "; fix the path, or drop --load to start from hf_checkpoint")
    if not any(p.is_dir() and p.name.isdigit() for p in path.iterdir()):
        raise PreflightError(f"load {load}: no checkpoint in it (no <rollout_id>/ dir); fix the path, or drop --load to start "
                             "from hf_checkpoint")


# ---- outputs ------------------------------------------------------------------------------------
def _outputs(cfg: TrainConfig) -> None:
    need = _bytes_needed(cfg)
    for field, path in (("run_dir", cfg.run_dir), ("save", cfg.save_dir), ("export", cfg.export_dir)):
        check_writable_dir(field, path, need)


def check_writable_dir(field: str, path: Path, need: int) -> None:
    """``path`` is (or can be made) a writable directory with ``need`` bytes free; creates it."""
    if path.exists() and not path.is_dir():
        raise PreflightError(f"{field} {path}: is a file; expected a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".miles-preflight-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise PreflightError(f"{field} {path}: not writable ({e.strerror}: {e.filename})") from None
    free = shutil.disk_usage(path).free
    if free < need:
        raise PreflightError(f"{field} {path}: {_mib(free)} free, a run needs at least {_mib(need)}; free space or choose "
                             "another directory")


def _bytes_needed(cfg: TrainConfig) -> int:
    model = Path(cfg.checkpoint.hf_checkpoint)
    if cfg.checkpoint.hf_checkpoint.startswith(BUILTIN) or not model.is_dir():
        return MIN_FREE_BYTES
    weights = sum(p.stat().st_size for p in model.iterdir() if p.suffix in (".safetensors", ".bin"))
    return max(MIN_FREE_BYTES, weights * (1 if cfg.checkpoint.no_save_optim else 3))


def _mib(n: int) -> str:
    return f"{n / 1024**2:.0f} MiB"
