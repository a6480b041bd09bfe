"""torch_dist checkpoints of the Megatron trainer: atomic, resumable exactly, independent of the parallel
layout for the model and optimizer (megatron's dist_checkpointing, format torch_dist).

    <save_dir>/<rollout_id>/
      torch_dist/          {"model": the GPT model's sharded state, "optimizer": AdamW's exp_avg /
                           exp_avg_sq sharded like their parameters, plus its common step (with
                           use_distributed_optimizer: megatron's DistributedOptimizer state, each
                           rank's fp32 main-parameter and moment shards, sharding type
                           dp_reshardable: read back at the same TP / PP / EP layout); with ppo also
                           "critic" and "critic_optimizer", the critic's (keys under "critic.")}
      model_args.json      the ModelArgs the model was built from (checked before loading: a checkpoint
                           of another shape is refused naming the fields)
      rng/<rank>.pt        each rank's CPU (and CUDA) generator and megatron's RNG tracker states
      meta.json            the runtime's state (data cursor, run ids, weight version) + steps_done
      .complete            manifest of every file, written last (checkpoint/_fs.write_marker)
    <save_dir>/latest      the rollout id, rewritten after the rename; then keep_last retention

Every rank writes its shards into ``<save_dir>/.tmp-<rollout_id>``; after a barrier rank 0 writes the
rest, the marker, renames the directory into place and moves ``latest``; a killed save leaves only the
temp dir, which readers skip. RNG resumes exactly when the parallel layout is unchanged.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from miles_core.checkpoint._fs import TMP_PREFIX, atomic_write_text, marker_problem, remove_tree, replace_dir, write_marker
from miles_core import finite

from .lora import adapters_only
from .model_args import ModelArgs

TORCH_DIST = "torch_dist"
ARGS_FILE = "model_args.json"
META_FILE = "meta.json"
LATEST = "latest"
# Megatron-LM's default: each rank writes and reads its own shards of the flat buffers, in parallel, no gather;
# the optimizer state then resumes at the same TP / PP / EP layout (any data-parallel size)
DIST_OPTIM = {"distrib_optim_sharding_type": "dp_reshardable"}


def _rank() -> int:
    return dist.get_rank()


def _barrier() -> None:
    dist.barrier()


def model_sharded(stage) -> dict:
    return stage.sharded_state_dict(prefix="")


def _trained(trainer) -> list[tuple[str, str, object, torch.optim.Optimizer, list]]:
    """(name, sharded-key prefix, module, optimizer, params) of each trained model: the policy, and the critic with ppo."""
    out = [("model", "", trainer.model.module, trainer.optimizer, trainer.params)]
    if trainer.critic is not None:
        c = trainer.critic
        out.append(("critic", "critic.", c.module.module, c.optimizer, c.params))
    return out


def _optim_key(name: str) -> str:
    return "optimizer" if name == "model" else f"{name}_optimizer"


def _is_megatron(optimizer) -> bool:
    """megatron-core's optimizer (use_distributed_optimizer, or 16-bit parameters), which shards its own state."""
    return hasattr(optimizer, "sharded_state_dict")


def _sharded(trainer, optim_of: list[str], loading: bool) -> dict:
    """The sharded state dict to save or load: each trained model's, and the optimizers of the models optim_of names."""
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding

    sharded = {}
    for name, prefix, module, optimizer, params in _trained(trainer):
        sharded[name] = module.sharded_state_dict(prefix=prefix)
        if name == "model" and trainer.lora:  # the frozen base is re-read from hf_checkpoint
            sharded[name] = adapters_only(sharded[name])
        if name not in optim_of:
            continue
        if _is_megatron(optimizer):
            state = optimizer.sharded_state_dict(sharded[name], is_loading=loading, metadata=DIST_OPTIM)
        else:
            state = optimizer_sharded(optimizer, params, sharded[name])
        if name != "model":  # megatron names every optimizer's shards "optimizer.*": the critic's get their own prefix
            replace_prefix_for_sharding(state, "optimizer.", f"{_optim_key(name)}.")
        sharded[_optim_key(name)] = state
    return sharded


def optimizer_sharded(optimizer: torch.optim.Optimizer, params: list, model_sd: dict) -> dict:
    """AdamW's state as sharded tensors shaped like their parameters; the per-parameter step kept once."""
    from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, optim_state_to_sharding_state

    state = optimizer.state_dict()
    steps = {float(s["step"]) for s in state["state"].values() if "step" in s}
    optim_state_to_sharding_state(state, get_param_id_to_sharded_param_map(model_sd, params), exclude_keys=("step",))
    state["state"]["common_step"] = steps.pop() if steps else 0.0
    return state


def init_optimizer_state(optimizer: torch.optim.Optimizer, params: list) -> None:
    """Create AdamW's per-parameter state (zeros), so a loaded checkpoint has tensors to fill."""
    for p in params:
        optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}


def init_distributed_state(optimizer, params: list) -> None:
    """The same for megatron's DistributedOptimizer: its shards' Adam moments, and, with torch's AdamW inside (no
    Transformer Engine / Apex), the per-parameter step its state_dict reads (it asserts one common step)."""
    from megatron.core.optimizer import distrib_optimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        opt.init_state_fn(opt.optimizer, opt.config)
        if not distrib_optimizer.HAVE_APEX_OR_TE:
            for state in opt.optimizer.state.values():
                state.setdefault("step", torch.tensor(0.0))


def _rng_state() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "tracker": get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.set_rng_state(state["cpu"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def save(trainer, save_dir: Path, rollout_id: int, state: dict) -> Path:
    """Collective: every rank calls it. -> the checkpoint dir."""
    from megatron.core import dist_checkpointing

    save_dir = Path(save_dir)
    tmp, final = save_dir / f"{TMP_PREFIX}{rollout_id}", save_dir / str(rollout_id)
    for _name, _prefix, module, _opt, _params in _trained(trainer):  # this rank's shards; never a non-finite checkpoint
        finite.check_weights(module.named_parameters(), f"checkpoint {rollout_id} in {save_dir}")
    if _rank() == 0:
        remove_tree(tmp)
        (tmp / TORCH_DIST).mkdir(parents=True)
        (tmp / "rng").mkdir()
    _barrier()
    # an optimizer that has not stepped yet (the actor's during num_critic_only_steps) has no state to save
    optim_of = [] if trainer.cfg.checkpoint.no_save_optim else [n for n, _, _, opt, _ in _trained(trainer) if opt.state]
    sharded = _sharded(trainer, optim_of, loading=False)
    dist_checkpointing.save(sharded, str(tmp / TORCH_DIST))
    torch.save(_rng_state(), tmp / "rng" / f"{_rank()}.pt")
    _barrier()
    if _rank() == 0:
        (tmp / ARGS_FILE).write_text(json.dumps(args_json(trainer.args), indent=1))
        shutil.copy(trainer.model_path / "config.json", tmp / "config.json")
        meta = {**state, "rollout_id": rollout_id, "world_size": dist.get_world_size(),
                "optimizer": bool(optim_of), "optimizer_states": optim_of, "critic": "critic" in sharded,
                "distributed_optimizer": trainer.p.use_distributed_optimizer}
        if trainer.lora:
            meta["lora_base_sha256"] = trainer.lora.adapters.base_sha256
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        write_marker(tmp)
        replace_dir(tmp, final)
        atomic_write_text(save_dir / LATEST, f"{rollout_id}\n")
        if trainer.cfg.checkpoint.keep_last is not None:
            _retain(save_dir, rollout_id, trainer.cfg.checkpoint.keep_last)
    _barrier()
    return final


def _retain(save_dir: Path, rollout_id: int, keep_last: int) -> None:
    """keep_last: of the checkpoints with id <= rollout_id keep the newest keep_last (newer ids are never touched)."""
    ids = sorted(int(p.name) for p in save_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) <= rollout_id)
    for old in ids[:-keep_last]:
        remove_tree(save_dir / str(old))


def latest(load_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, if it is complete."""
    pointer = Path(load_dir) / LATEST
    if not pointer.is_file():
        return None
    path = Path(load_dir) / pointer.read_text().strip()
    return path if path.is_dir() and marker_problem(path) is None else None


def args_json(args: ModelArgs) -> dict:
    """ModelArgs as model_args.json holds them (tuples as lists)."""
    return json.loads(json.dumps(asdict(args)))


def check_args(path: Path, args: ModelArgs) -> None:
    """Refuse a checkpoint of another model shape, naming each differing field."""
    if not (path / ARGS_FILE).is_file():
        raise ValueError(f"{path} is not a torch_dist checkpoint of miles: it has no {ARGS_FILE}")
    saved, mine = json.loads((path / ARGS_FILE).read_text()), args_json(args)
    diffs = [f"{k} {v!r} (this model: {mine.get(k)!r})" for k, v in saved.items() if mine.get(k) != v]
    if diffs:
        raise ValueError(f"torch_dist checkpoint {path} is of another model shape: " + "; ".join(diffs))


def _load_distributed(optimizer, state: dict) -> None:
    """Load megatron's DistributedOptimizer. With torch's AdamW inside (no Transformer Engine / Apex) megatron 0.16
    restores the step from its parameter-state shards, which hold the loading template's, and shares one step tensor
    between all parameters (AdamW would advance it once per parameter): each parameter gets the saved common step."""
    from megatron.core.optimizer import distrib_optimizer

    opts = getattr(optimizer, "chained_optimizers", [optimizer])
    states = [state] if len(opts) == 1 else [state[i] for i in range(len(opts))]
    steps = [max(float(g["step"]) for g in st["optimizer"]["param_groups"] if g.get("step") is not None) for st in states]
    with torch.no_grad():  # fp32 parameters' main shards are views of the parameters, filled in place
        optimizer.load_state_dict(state)
    if not distrib_optimizer.HAVE_APEX_OR_TE:
        for opt, step in zip(opts, steps):
            for s in opt.optimizer.state.values():
                s["step"] = torch.tensor(step)


def _is_distributed(optimizer) -> bool:
    return all(hasattr(opt, "shard_fp32_from_float16_groups") for opt in getattr(optimizer, "chained_optimizers", [optimizer]))


def _load_optimizer(optimizer, state: dict) -> None:
    if _is_megatron(optimizer) and _is_distributed(optimizer):
        _load_distributed(optimizer, state)
        return
    if _is_megatron(optimizer):  # Float16OptimizerWithFloat16Params (16-bit, no distributed optimizer): its own common step,
        with torch.no_grad():    # the fp32 main weights copied from the checkpoint's fp32_param shards
            optimizer.load_state_dict(state)
        return
    step = state["state"].pop("common_step")
    for s in state["state"].values():
        s["step"] = torch.tensor(float(step))
    optimizer.load_state_dict(state)


MEGATRON_LM_MARKERS = ("latest_checkpointed_iteration.txt", ".metadata", "common.pt")  # what Megatron-LM's save writes


def refuse_megatron_lm(path: Path) -> None:
    """A Megatron-LM checkpoint (iter_<N>/ dirs, latest_checkpointed_iteration.txt) is refused saying what it is."""
    path = Path(path)
    if re.fullmatch(r"iter_\d+", path.name) or any((path / name).exists() for name in MEGATRON_LM_MARKERS):
        raise ValueError(f"{path} is a Megatron-LM checkpoint (its iter_<N>/ layout), not a torch_dist dir miles wrote "
                         f"(torch_dist/, {ARGS_FILE} and a .complete marker, written last). miles does not read Megatron-LM's "
                         "layout: start from the model's HF weights (hf_checkpoint, or miles convert hf-to-torch-dist HF_DIR OUT), "
                         "or export this checkpoint to HF with Megatron-LM's own tools first")


def restore(trainer, load_dir: Path) -> dict | None:
    """Collective. Load the latest complete checkpoint into the trainer; -> its meta state, None if there is none."""
    from megatron.core import dist_checkpointing

    path = latest(load_dir)
    if path is None:
        refuse_megatron_lm(load_dir)  # not a fresh start: a checkpoint of another tool is there
        return None
    check_args(path, trainer.args)
    meta = json.loads((path / META_FILE).read_text())
    if meta.get("critic", False) != (trainer.critic is not None):
        raise ValueError(f"torch_dist checkpoint {path} {'holds' if meta.get('critic') else 'has no'} a critic and this run "
                         f"{'has none' if meta.get('critic') else 'trains one'} (advantage_estimator ppo): load it with the "
                         "advantage_estimator it was saved with")
    if trainer.lora:
        trainer.lora.adapters.check_base(meta.get("lora_base_sha256"), path)
    elif "lora_base_sha256" in meta:
        raise ValueError(f"torch_dist checkpoint {path} holds LoRA adapters only (lora_base_sha256), and this run trains the "
                         "whole model (lora_rank 0): resume with the LoRA config it was saved with")
    optim_of = meta.get("optimizer_states", ["model"] if meta["optimizer"] else [])
    if optim_of and meta.get("distributed_optimizer", False) != trainer.p.use_distributed_optimizer:
        raise ValueError(f"torch_dist checkpoint {path} holds the optimizer state of use_distributed_optimizer "
                         f"{str(meta.get('distributed_optimizer', False)).lower()}, this run sets it "
                         f"{str(trainer.p.use_distributed_optimizer).lower()}: resume with the setting it was saved with")
    for name, _, _, optimizer, params in _trained(trainer):
        if name in optim_of:
            (init_distributed_state if _is_megatron(optimizer) else init_optimizer_state)(optimizer, params)
    loaded = dist_checkpointing.load(_sharded(trainer, optim_of, loading=True), str(path / TORCH_DIST))
    for name, _, module, optimizer, _ in _trained(trainer):
        module.load_state_dict(loaded[name], strict=False)
        if name in optim_of:
            _load_optimizer(optimizer, loaded[_optim_key(name)])
    rng = path / "rng" / f"{_rank()}.pt"
    if meta["world_size"] == dist.get_world_size() and rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=True))
    internal = ("world_size", "optimizer", "optimizer_states", "critic", "distributed_optimizer", "lora_base_sha256")
    return {k: v for k, v in meta.items() if k not in internal}
