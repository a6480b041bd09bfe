"""LoRA in the Megatron trainer (miles_core/training/megatron/lora.py) is the torch trainer's (PEFT's): one GRPO step
from the same adapters gives the same loss, grad norm and adapter update (canonical_lora: PEFT's adapters; lora: the
fused layers' shared A, built in the torch trainer by sharing PEFT's lora_A modules); the base stays bit-identical;
TP=2 equals TP=1; the engines get the merged weights; a checkpoint holds the adapters only and resumes exactly; the export is a
PEFT adapter dir that PeftModel.from_pretrained loads over the base."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from miles_core.training.batch import make_batch
from miles_core.training.lora import LoraAdapters
from miles_core.training.megatron.trainer import MegatronTrainer
from miles_core.training.torch_trainer import TorchTrainer

from .conftest import tiny_hf
from .test_parallel import _port, two_rank_cfg

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import _ranks by this name
import _ranks  # noqa: E402

PAD = 0
PARTIAL = "q_proj,v_proj,o_proj,up_proj,down_proj"  # k of linear_qkv and gate of linear_fc1 left without adapters
LORA = {"lora_rank": 4, "lora_alpha": 8}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Qwen2 (4 heads over 2 query groups, so linear_qkv interleaves q/k/v per group) as an HF dir."""
    path = tmp_path_factory.mktemp("hf")
    tiny_hf("qwen2").save_pretrained(path)
    return path


FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # what lora_type lora fuses (one A each)


class SharedA(LoraAdapters):
    """PEFT's adapters with one lora_A module shared by the HF modules a Megatron layer fuses: the torch form of
    lora_type lora (Megatron-Bridge's LoRA on linear_qkv / linear_fc1), autograd summing the shared A's gradient."""

    def apply(self, model):
        model = super().apply(model)
        for layer in model.model.layers:
            for block, names in ((layer.self_attn, FUSED_GROUPS[0]), (layer.mlp, FUSED_GROUPS[1])):
                for n in names[1:]:
                    getattr(block, n).lora_A["default"] = getattr(block, names[0]).lora_A["default"]
        return model


def _adapter_dir(cfg, hf_dir: Path, out: Path) -> Path:
    """A PEFT adapter dir with random A and B (B is zero at init, which would leave A's gradient zero): both trainers
    start from it through lora_adapter_path. lora_type lora: one A per fused layer, repeated for its HF modules."""
    from transformers import AutoModelForCausalLM

    lora = LoraAdapters(cfg.lora, str(hf_dir))
    model = lora.apply(AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
        if cfg.lora.lora_type == "lora":
            for layer in model.model.layers:
                for block, names in ((layer.self_attn, FUSED_GROUPS[0]), (layer.mlp, FUSED_GROUPS[1])):
                    for n in names[1:]:
                        getattr(block, n).lora_A["default"].weight.copy_(getattr(block, names[0]).lora_A["default"].weight)
    lora.save_adapter(model, out)
    return out


def _cfg(cfg, hf_dir, tmp_path, targets, lora_type="canonical_lora", **over):
    base = cfg(target_modules=targets, lora_type=lora_type, **LORA, **over)
    path = _adapter_dir(base, hf_dir, tmp_path / f"adapter-{lora_type}-{targets}")
    return cfg(target_modules=targets, lora_type=lora_type, lora_adapter_path=str(path), **LORA, **over)


@pytest.mark.parametrize("lora_type, targets", [("canonical_lora", "all-linear"), ("canonical_lora", PARTIAL),
                                                ("lora", "all-linear")])
def test_a_lora_step_equals_the_torch_trainers_and_moves_only_the_adapters(megatron_world, tmp_path, hf_dir, cfg, samples,
                                                                          lora_type, targets):
    """canonical_lora: PEFT's adapters; lora: the fused layers' shared A, as SharedA builds it in the torch trainer."""
    from transformers import AutoModelForCausalLM

    c = _cfg(cfg, hf_dir, tmp_path, targets, lora_type, micro_batch_size=4, adam_eps=1.0)  # adam_eps 1: tests/training/test_lora.py
    rewards = [s.reward for s in samples]
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    strategy = (SharedA if lora_type == "lora" else LoraAdapters)(c.lora, str(hf_dir))
    torch_trainer = TorchTrainer(copy.deepcopy(hf), c, pad_id=PAD, lora=strategy)
    mega = MegatronTrainer(c, hf_dir, pad_id=PAD)
    engine = mega.engine
    start = engine.lora.gather(engine.model.module)
    base_before = {k: v.detach().clone() for k, v in engine.model.module.named_parameters() if "lora_" not in k}
    assert dict(mega.named_tensors()).keys() == dict(torch_trainer.named_tensors()).keys()
    for name, t in torch_trainer.named_tensors():  # the merged weights of the same adapters, before any step
        assert (dict(mega.named_tensors())[name] - t).abs().max() < 1e-6, name

    torch_rollout, torch_steps = torch_trainer.train_rollout(samples, rewards)
    out = mega.train_rollout(samples, rewards)
    steps = out.steps
    assert out.rollout["rollout/log_probs"] == pytest.approx(torch_rollout["rollout/log_probs"], rel=1e-5)
    # the step-0 loss is 0 in exact arithmetic (ratio 1, group-centred advantages): terms of size ~1 cancel, and the
    # float32 rounding of the two layouts (megatron packs each micro-batch, qkv_format thd) leaves up to ~1e-7 of them
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert steps[0][key] == pytest.approx(torch_steps[0][key], rel=1e-5, abs=1e-6), key
    after = engine.lora.gather(engine.model.module)
    theirs = {k.removeprefix("base_model.model."): v for k, v in _peft_state(torch_trainer).items()}
    assert after.keys() == theirs.keys() == start.keys()
    for name in after:
        ours, upd = after[name] - start[name], theirs[name] - start[name]
        assert upd.norm() > 0 and (ours - upd).norm() <= 1e-3 * upd.norm(), name
    base_after = dict(engine.model.module.named_parameters())
    assert all(torch.equal(base_after[k], v) for k, v in base_before.items())  # bit-identical base
    assert all(("lora_" in n) == p.requires_grad for n, p in engine.model.module.named_parameters())


def _peft_state(trainer) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {"base_model.model." + k: v for k, v in get_peft_model_state_dict(trainer.engine.model, adapter_name="default").items()}


def test_two_tensor_parallel_ranks_equal_one(megatron_world, tmp_path, hf_dir, cfg, samples):
    """Both lora types (fused B rows of linear_qkv / linear_fc1 split like their weights; per-module B's) in one 2-rank run."""
    cfgs = {t: _cfg(cfg, hf_dir, tmp_path, "all-linear" if t == "lora" else PARTIAL, t, micro_batch_size=2)
            for t in ("lora", "canonical_lora")}
    out = tmp_path / "ranks.pt"
    sized = {t: two_rank_cfg(lambda c=c, **o: c.model_copy(), {"tensor_model_parallel_size": 2}) for t, c in cfgs.items()}
    mp.spawn(_ranks.run_configs, args=(2, _port(), sized, str(hf_dir), samples, str(out)), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    for t, c in cfgs.items():
        one = MegatronTrainer(c, hf_dir, pad_id=PAD)
        before = dict(one.named_tensors())
        logp = one.engine.compute_log_probs(one.engine.model, make_batch(samples, 0))
        steps = one.train_rollout(samples, [s.reward for s in samples]).steps
        after = dict(one.named_tensors())
        assert (two[t]["logp"] - logp).abs().max() < 1e-5, t
        for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
            assert two[t]["steps"][0][key] == pytest.approx(steps[0][key], rel=1e-5, abs=1e-7), (t, key)
        for name, w in after.items():  # the merged weights: base + s B A, the adapters' update gathered over TP
            update = w - before[name]
            assert (two[t]["tensors"][name] - before[name] - update).norm() <= 1e-3 * update.norm() + 1e-12, (t, name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_checkpoint_holds_the_adapters_only_resumes_exactly_and_refuses_another_base(megatron_world, tmp_path, hf_dir, cfg,
                                                                                       samples, dtype):
    """bf16: the adapters' fp32 main weights go through megatron's mixed-precision optimizer and its checkpoint."""
    from megatron.core.dist_checkpointing import load_tensors_metadata

    c = cfg(target_modules="all-linear", lr=1e-2, num_steps_per_rollout=2, dtype=dtype, **LORA)
    rewards = [s.reward for s in samples]
    straight = MegatronTrainer(c, hf_dir, pad_id=PAD)
    straight.train_rollout(samples, rewards)
    straight.save(tmp_path / "ckpt", 0, {"data_source": {"offset": 8}})
    second = straight.train_rollout(samples, rewards)

    saved = load_tensors_metadata(str(tmp_path / "ckpt" / "0" / "torch_dist"))
    model_keys = [k for k in saved if not k.startswith("optimizer.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)  # no base tensor
    resumed = MegatronTrainer(c, hf_dir, pad_id=PAD)
    assert resumed.restore(tmp_path / "ckpt")["data_source"] == {"offset": 8}
    again = resumed.train_rollout(samples, rewards)
    assert again.steps == second.steps
    mine, theirs = dict(resumed.named_tensors()), dict(straight.named_tensors())
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)

    other = tmp_path / "other-base"
    tiny_hf("qwen2", seed=1).save_pretrained(other)
    with pytest.raises(ValueError, match="trained over a different base model"):
        MegatronTrainer(c, other, pad_id=PAD).restore(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="holds LoRA adapters only"):
        MegatronTrainer(cfg(dtype=dtype), hf_dir, pad_id=PAD).restore(tmp_path / "ckpt")


def test_the_export_is_a_peft_adapter_over_the_base_and_a_merged_hf_model(megatron_world, tmp_path, hf_dir, cfg, samples,
                                                                           tiny_tokenizer):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    c = _cfg(cfg, hf_dir, tmp_path, PARTIAL)
    mega = MegatronTrainer(c, hf_dir, pad_id=PAD)
    mega.train_rollout(samples, [s.reward for s in samples])
    path = mega.engine.export(tmp_path / "export", 0, tiny_tokenizer)
    tokens = torch.tensor([s.tokens for s in samples[:1]])
    merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32), path / "adapter")
    with torch.no_grad():
        assert (peft(tokens).logits - merged(tokens).logits).abs().max() < 1e-5
    logp = mega.engine.compute_log_probs(mega.engine.model, make_batch(samples[:1], PAD))
    theirs = torch.log_softmax(merged(tokens).logits[0, :-1].float() / c.rollout.rollout_temperature, -1)
    n = samples[0].response_length
    ref = theirs[-n:].gather(-1, tokens[0, -n:, None]).squeeze(-1)
    assert (logp[0, :n] - ref).abs().max() < 1e-5


@pytest.mark.parametrize("kind, targets, match", [
    ("glm4_moe", "all-linear", "an MoE model"),
    ("qwen2", "lm_head", r"target_modules \['lm_head'\]"),
    ("qwen2", PARTIAL, "lora_type lora .* fused linear_qkv .* adapts only q_proj, v_proj of it"),
])
def test_what_it_does_not_build_is_refused_before_any_weight_is_read(megatron_world, tmp_path, cfg, kind, targets, match):
    tiny_hf(kind).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=match):
        MegatronTrainer(cfg(target_modules=targets, **LORA), tmp_path, pad_id=PAD)


def test_a_per_module_adapter_is_refused_by_the_fused_lora_type(megatron_world, tmp_path, hf_dir, cfg):
    """A PEFT dir whose q/k/v adapters have their own A (canonical_lora's) cannot be one fused adapter."""
    per_module = _cfg(cfg, hf_dir, tmp_path, "all-linear", "canonical_lora").lora.lora_adapter_path
    with pytest.raises(ValueError, match="their lora_A differ.* set lora_type canonical_lora"):
        MegatronTrainer(cfg(target_modules="all-linear", lora_adapter_path=per_module, **LORA), hf_dir, pad_id=PAD)


def test_three_rollouts_of_adapters_move_the_policy_toward_reward(megatron_world, tmp_path, lm, cfg, samples):
    """Reward 1 on odd samples of each group: from the zero-B init, their mean log-prob rises and the others' falls,
    for each of three adapter inits (misc.seed); lora_type lora (one A per fused layer), the default: the margins
    measured were 0.23-0.27 up and 0.14 down (canonical_lora: 0.21-0.24, 0.13-0.15)."""
    lm(seed=1).save_pretrained(tmp_path)
    rewards = [s.reward for s in samples]
    good = torch.tensor(rewards) == 1
    for seed in (0, 1, 2):
        mega = MegatronTrainer(cfg(target_modules="all-linear", lr=1e-2, seed=seed, **LORA), tmp_path, pad_id=PAD)
        start = torch.tensor(mega.mean_log_probs(samples))
        for _ in range(3):
            mega.train_rollout(samples, rewards)
        moved = torch.tensor(mega.mean_log_probs(samples)) - start
        assert moved[good].mean() > 0.05 and moved[~good].mean() < -0.05, seed
