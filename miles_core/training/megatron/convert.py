"""HF <-> torch_dist conversion (``miles convert hf-to-torch-dist`` / ``torch-dist-to-hf``).

    hf-to-torch-dist HF_DIR OUT   config.json -> model args; the HF tensors validated against them (a missing
                                  or mis-shaped tensor is named with its config field); the GPT model built
                                  on this rank's share of the current megatron world and saved with
                                  dist_checkpointing. OUT/: torch_dist/, model_args.json, config.json, .complete
    torch-dist-to-hf CKPT OUT     the model args of CKPT (a conversion output or a trainer checkpoint),
                                  checked against CKPT's config.json (or --config); the model loaded, its
                                  shards gathered, written as OUT/model.safetensors (the hub's tensor names: per-expert
                                  experts.{e}.gate_proj / up_proj / down_proj) + config.json (+ the
                                  tokenizer files of --tokenizer), .complete last

torch_dist does not record the parallel layout, so a checkpoint written at TP=2 reads at TP=1 and the
other way round. Collective when the world has several ranks; rank 0 writes the HF files.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from miles_core.checkpoint._fs import marker_problem, remove_tree, replace_dir, write_marker
from miles_core.config.parallel import ParallelConfig

from . import checkpoint, model, parallel, weights
from .model_args import ModelArgs, from_hf_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "generation_config.json", "chat_template.jinja")


@contextlib.contextmanager
def _world():
    """Megatron groups for a conversion: the current ones, else a one-rank world for its duration."""
    from megatron.core import parallel_state as ps

    started = not ps.model_parallel_is_initialized()
    if started:
        parallel.init_parallel(ParallelConfig(), seed=0, device="cuda" if torch.cuda.is_available() else "cpu")
    try:
        yield
    finally:
        if started:
            parallel.teardown()


def _stage(args: ModelArgs):
    cfg = model.transformer_config(args, _current_parallel(), torch.float32, cpu=not torch.cuda.is_available())
    return model.build_stage(args, cfg)


def _current_parallel() -> ParallelConfig:
    from megatron.core import parallel_state as ps

    return ParallelConfig(tensor_model_parallel_size=ps.get_tensor_model_parallel_world_size(),
                          pipeline_model_parallel_size=ps.get_pipeline_model_parallel_world_size(),
                          expert_model_parallel_size=ps.get_expert_model_parallel_world_size(),
                          expert_tensor_parallel_size=ps.get_expert_tensor_parallel_world_size())


def _publish(tmp: Path, out: Path) -> None:
    if dist.get_rank() == 0:
        write_marker(tmp)
        replace_dir(tmp, out)
    dist.barrier()


def hf_to_torch_dist(hf_dir: Path, out: Path) -> dict:
    """Convert an HF dir into a torch_dist dir (see the module docstring). -> a summary."""
    from megatron.core import dist_checkpointing

    hf_dir, out = Path(hf_dir), Path(out)
    config = json.loads((hf_dir / "config.json").read_text())
    args = from_hf_config(config, str(hf_dir / "config.json"))
    state = weights.load_hf_state(hf_dir, args)
    with _world():
        args = args.padded_for(_current_parallel().tensor_model_parallel_size)
        stage = _stage(args)
        stage.load_state_dict(weights.shard(weights.hf_to_full(state, args), stage), strict=False)
        tmp = out.parent / f".tmp-{out.name}"
        if dist.get_rank() == 0:
            remove_tree(tmp)
            (tmp / checkpoint.TORCH_DIST).mkdir(parents=True)
            (tmp / checkpoint.ARGS_FILE).write_text(json.dumps(checkpoint.args_json(args), indent=1))
            shutil.copy(hf_dir / "config.json", tmp / "config.json")
        dist.barrier()
        dist_checkpointing.save({"model": checkpoint.model_sharded(stage)}, str(tmp / checkpoint.TORCH_DIST))
        dist.barrier()
        _publish(tmp, out)
    return {"torch_dist": str(out), "tensors": len(state), "model_type": config.get("model_type")}


def torch_dist_to_hf(ckpt: Path, out: Path, config: Path | None = None, tokenizer: Path | None = None) -> dict:
    """Convert a torch_dist dir (conversion output or trainer checkpoint) into an HF dir. -> a summary."""
    from megatron.core import dist_checkpointing

    ckpt, out = Path(ckpt), Path(out)
    _check_written_by_miles(ckpt)
    config_path = Path(config) if config else ckpt / "config.json"
    config_path = config_path / "config.json" if config_path.is_dir() else config_path
    if not config_path.is_file():
        raise ValueError(f"torch_dist checkpoint {ckpt} has no config.json; pass --config (the model's HF config.json)")
    hf_config = json.loads(config_path.read_text())
    args = from_hf_config(hf_config, str(config_path))
    saved = json.loads((ckpt / checkpoint.ARGS_FILE).read_text()) if (ckpt / checkpoint.ARGS_FILE).is_file() else {}
    args = replace(args, padded_vocab_size=saved.get("padded_vocab_size"))  # a trainer checkpoint at TP > 1 may pad the vocab
    checkpoint.check_args(ckpt, args)
    with _world():
        stage = _stage(args)
        loaded = dist_checkpointing.load({"model": checkpoint.model_sharded(stage)}, str(ckpt / checkpoint.TORCH_DIST))
        stage.load_state_dict(loaded["model"], strict=False)
        hf = weights.full_to_hf(weights.gather_full(stage), args)
        weights.validate_hf(hf, args, str(ckpt))
        tmp = out.parent / f".tmp-{out.name}"
        if dist.get_rank() == 0:
            _write_hf(tmp, hf, config_path, tokenizer)
        dist.barrier()
        _publish(tmp, out)
    return {"hf": str(out), "tensors": len(hf), "model_type": hf_config.get("model_type")}


def _check_written_by_miles(ckpt: Path) -> None:
    """A torch_dist dir of miles (torch_dist/, model_args.json, .complete last) or a clear refusal saying what it is."""
    problem = marker_problem(ckpt)
    if problem is None:
        return
    if not ckpt.is_dir():
        raise ValueError(f"{ckpt}: no such directory (expected a torch_dist dir of miles convert hf-to-torch-dist or of a "
                         "trainer checkpoint)")
    checkpoint.refuse_megatron_lm(ckpt)
    raise ValueError(f"{ckpt} is not a complete torch_dist dir of miles: {problem}. If its write was interrupted, write it "
                     "again; miles' torch_dist dirs (miles convert hf-to-torch-dist, trainer checkpoints) end with that marker")


def _write_hf(tmp: Path, hf: dict[str, torch.Tensor], config_path: Path, tokenizer: Path | None) -> None:
    from safetensors.torch import save_file

    from miles_core.checkpoint.hf_load import check_hf_weights, to_hub_form

    remove_tree(tmp)
    tmp.mkdir(parents=True)
    shutil.copy(config_path, tmp / "config.json")
    save_file(to_hub_form(tmp / "config.json", hf), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    check_hf_weights(tmp)  # what every loader checks: the export passes it before it is published
    for name in TOKENIZER_FILES if tokenizer else ():
        if (Path(tokenizer) / name).is_file():
            shutil.copy(Path(tokenizer) / name, tmp / name)
