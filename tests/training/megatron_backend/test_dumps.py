"""The Megatron trainer's tensor dumps (dumper_fwd_only / dumper_fwd_bwd, training/dumps.py): the stage's inputs per
micro-batch, its parameters and their gradients (Megatron's main_grad) in SGLang's layout, with the parallel info
SGLang's comparator reads."""

from __future__ import annotations

import torch

from miles_core.training.megatron.trainer import MegatronTrainer

PAD = 0


def test_the_megatron_stage_s_passes_are_dumped(megatron_world, tmp_path, lm, cfg, samples):
    lm(seed=1).save_pretrained(tmp_path / "hf")
    c = cfg(runtime="ray", train_backend="megatron", num_steps_per_rollout=2, micro_batch_size=2, dumper_enable=True,
            dumper_dir=str(tmp_path / "d"), dumper_fwd_bwd=["enable_model_grad=1"])
    mega = MegatronTrainer(c, tmp_path / "hf", pad_id=PAD)
    try:
        mega.train_rollout(samples, [s.reward for s in samples], 1)
    finally:
        mega.close()
    fwd = {p.name: p for p in (tmp_path / "d" / "fwd_only" / "rollout_1").glob("*.pt")}
    names = {dict(kv.split("=", 1) for kv in n[:-3].split("___"))["name"] for n in fwd}
    assert {"input_ids", "position_ids"} <= names  # GPTModel's inputs (mode core)
    meta = torch.load(next(iter(fwd.values())), weights_only=False)["meta"]
    assert meta["megatron_parallel_info"]["tp_size"] == 1 and meta["world_size"] == 1
    grads = [p for p in (tmp_path / "d" / "fwd_bwd" / "rollout_1").glob("*name=grad__param__*.pt")]
    params = [n for n, p in mega.engine.model.named_parameters() if p.requires_grad]
    assert len(grads) == len(params) > 0  # each parameter's main_grad, before the update
    assert any(torch.load(g, weights_only=False)["value"].abs().sum() > 0 for g in grads)
