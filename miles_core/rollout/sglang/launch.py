"""The ``python -m sglang.launch_server`` command of one engine, and the check that SGLang is installed.

    spec = EngineLaunch(model_path="/ckpt/hf", host="10.0.0.5", port=30001, api_key=key)
    argv = launch_command(cfg, spec)       # pure: the same config and spec give the same argv
    require_sglang(cfg)                    # when a run starts, before any model loads

The argv: the model path, host, port, ``--tp-size`` = rollout_num_gpus_per_engine, the run's API key,
``--random-seed`` = seed + engine index, ``--enable-memory-saver`` when the engines release
memory around training (offload_rollout; by default when colocated), multi-node flags when an engine spans nodes,
SGLang's LoRA arguments when the engines serve the adapter (lora_server_args), then every passthrough
(``sglang_server_args``) in the CLI form SGLang's argparse reads (server_args.to_argv), in the order
the config gives them. sglang is never imported here: the command runs in the engine's own process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import secrets
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import SGLANG_VERSION
from miles_core.config.lora import ALL_LINEAR, MEGATRON_MODULES
from miles_core.config.server_args import to_argv

if TYPE_CHECKING:
    from miles_core.config import TrainConfig

DECODER_MODULES = tuple(m for names in MEGATRON_MODULES.values() for m in names)  # q,k,v,o,gate,up,down (all-linear)
INSTALL = f"pip install 'miles[sglang]'   (sglang=={SGLANG_VERSION}; it needs torch 2.14.1 and transformers 5.19.0: use its own environment or the CUDA image, docs/docker.md)"


@dataclass(frozen=True)
class EngineLaunch:
    """Where one engine runs. nnodes > 1: the engine spans nodes (rank ``node_rank`` of ``nnodes``,
    rendezvous at ``dist_init_addr`` = host:port of node 0)."""

    model_path: str
    host: str
    port: int
    api_key: str
    engine_index: int = 0
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None


def new_api_key() -> str:
    """A fresh API key for one run's engines (every engine of the run shares it)."""
    return secrets.token_urlsafe(32)


def launch_command(cfg: "TrainConfig", spec: EngineLaunch, python: str = sys.executable) -> list[str]:
    """-> argv of ``python -m sglang.launch_server`` for this engine. Raises ValueError for a spec that
    cannot be right (no API key, a multi-node engine without its rendezvous address)."""
    if not spec.api_key:
        raise ValueError("EngineLaunch.api_key is empty: every engine requires the run's API key (new_api_key())")
    if spec.nnodes > 1 and not spec.dist_init_addr:
        raise ValueError(f"an engine over {spec.nnodes} nodes needs dist_init_addr (host:port of its node 0)")
    argv = [python, "-m", "sglang.launch_server",
            "--model-path", str(spec.model_path), "--host", spec.host, "--port", str(spec.port),
            "--tp-size", str(cfg.cluster.rollout_num_gpus_per_engine), "--api-key", spec.api_key,
            "--random-seed", str(cfg.misc.seed + spec.engine_index)]
    if cfg.cluster.rollout_offload_tags:  # SGLang releases memory only with its memory saver
        argv.append("--enable-memory-saver")
    if cfg.tracking.use_miles_dashboard:  # the dashboard scrapes every engine's /metrics (tracking/dashboard/scraper.py)
        argv.append("--enable-metrics")
    if spec.nnodes > 1:
        argv += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank), "--dist-init-addr", spec.dist_init_addr]
    for name, value in lora_server_args(cfg).items():
        argv += to_argv(name, value)
    for name, value in cfg.sglang.sglang_server_args.items():
        argv += to_argv(name, value)
    return argv


def lora_server_args(cfg: "TrainConfig") -> dict[str, Any]:
    """SGLang's LoRA arguments when its engines serve the adapter (lora_sync_from_tensor; config/rules.py
    LORA_SERVER_ARGS), as the reference's sglang_engine.py sets them for one adapter: enable_lora, max_loras_per_batch 1,
    max_lora_rank = lora_rank, lora_target_modules = the HF module names (``all`` for all-linear without exclusions).
    No lora_paths: the sync before rollout 0 loads the trainer's adapter (from lora_adapter_path, if given) by
    /load_lora_adapter. With lora_base_cpu_backup also enable_weights_cpu_backup (the reference's sglang_engine.py sets it
    when lora_base_cpu_backup_enabled: LoRA, colocate and the flag), so a release keeps the base for the adapter syncs.
    {} otherwise (merged weights: the engines serve a plain model)."""
    lo = cfg.lora
    if not (lo.enabled and lo.lora_sync_from_tensor):
        return {}
    if lo.targets == ALL_LINEAR:
        targets = ["all"] if not lo.excluded else [m for m in DECODER_MODULES if m not in lo.excluded]
    else:
        targets = [m for m in lo.targets if m not in lo.excluded]
    args = {"enable_lora": True, "max_loras_per_batch": 1, "max_lora_rank": lo.lora_rank, "lora_target_modules": targets}
    return {**args, "enable_weights_cpu_backup": True} if lo.lora_base_cpu_backup else args


def engine_client_options(cfg: "TrainConfig", api_key: str | None) -> dict[str, Any]:
    """Keyword arguments of ``HTTPEngineClient`` for an SGLang engine of this run: the API key and the
    read timeout of a request (miles_router_timeout, else sglang_router_request_timeout_secs)."""
    from miles_core.rollout.http.options import client_options

    opts = client_options(cfg, api_key)
    return {"api_key": opts["api_key"], "timeout_s": opts["timeout_s"]}


class SGLangNotInstalled(RuntimeError):
    """rollout_engine sglang in an environment without the pinned SGLang."""


def require_sglang(cfg: "TrainConfig") -> None:
    """With rollout_engine sglang, SGLang (the pinned version) must be installed; raises
    SGLangNotInstalled with the install command. Imports nothing (a spec lookup and the package's
    metadata), so it is cheap and safe before any model loads. Other engines: no check."""
    if cfg.cluster.rollout_engine == "sglang":
        check_sglang_installed()


def check_sglang_installed() -> str:
    """-> the installed SGLang's version when it is the pinned one; else raises SGLangNotInstalled."""
    if importlib.util.find_spec("sglang") is None:
        raise SGLangNotInstalled(f"rollout_engine: sglang needs SGLang {SGLANG_VERSION}, which is not installed here; "
                                 f"install it with: {INSTALL}")
    try:
        found = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        found = "unknown"
    if found != SGLANG_VERSION:
        raise SGLangNotInstalled(f"rollout_engine: sglang needs SGLang {SGLANG_VERSION} (its server arguments are what "
                                 f"miles validates, docs/reference/sglang.md) but {found} is installed; {INSTALL}")
    return found
