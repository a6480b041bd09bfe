"""LoRA in the Megatron trainer (miles_core/training/megatron/lora.py) is the torch trainer's (PEFT's): one GRPO step
from the same adapters gives the same loss, grad norm and adapter update; the base stays bit-identical; TP=2 equals
TP=1; the engines get the merged weights; a checkpoint holds the adapters only and resumes exactly; the export is a
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


def _adapter_dir(cfg, hf_dir: Path, out: Path) -> Path:
    """A PEFT adapter dir with random A and B (B is zero at init, which would leave A's gradient zero): both trainers
    start from it through lora_adapter_path."""
    from transformers import AutoModelForCausalLM

    lora = LoraAdapters(cfg.lora, str(hf_dir))
    model = lora.apply(AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    lora.save_adapter(model, out)
    return out


def _cfg(cfg, hf_dir, tmp_path, targets, **over):
    base = cfg(target_modules=targets, **LORA, **over)
    path = _adapter_dir(base, hf_dir, tmp_path / f"adapter-{targets}")
    return cfg(target_modules=targets, lora_adapter_path=str(path), **LORA, **over)


@pytest.mark.parametrize("targets", ["all-linear", PARTIAL])
def test_a_lora_step_equals_the_torch_trainers_and_moves_only_the_adapters(megatron_world, tmp_path, hf_dir, cfg, samples,
                                                                          targets):
    from transformers import AutoModelForCausalLM

    c = _cfg(cfg, hf_dir, tmp_path, targets, micro_batch_size=4, adam_eps=1.0)  # adam_eps 1: see tests/training/test_lora.py
    rewards = [s.reward for s in samples]
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    torch_trainer = TorchTrainer(copy.deepcopy(hf), c, pad_id=PAD, lora=LoraAdapters(c.lora, str(hf_dir)))
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
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert steps[0][key] == pytest.approx(torch_steps[0][key], rel=1e-5, abs=1e-7), key
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
    c = _cfg(cfg, hf_dir, tmp_path, PARTIAL, micro_batch_size=2)
    one = MegatronTrainer(c, hf_dir, pad_id=PAD)
    before = dict(one.named_tensors())
    logp = one.engine.compute_log_probs(one.engine.model, make_batch(samples, 0))
    steps = one.train_rollout(samples, [s.reward for s in samples]).steps
    after = dict(one.named_tensors())
    out = tmp_path / "rank0.pt"
    mp.spawn(_ranks.run_rank, args=(2, _port(), two_rank_cfg(lambda **o: c.model_copy(), {"tensor_model_parallel_size": 2}),
                                    str(hf_dir), samples, str(out)), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    assert (two["logp"] - logp).abs().max() < 1e-5
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert two["steps"][0][key] == pytest.approx(steps[0][key], rel=1e-5, abs=1e-7), key
    for name, t in after.items():  # the merged weights: base + s B A, the adapters' update gathered over TP
        update = t - before[name]
        assert (two["tensors"][name] - before[name] - update).norm() <= 1e-3 * update.norm() + 1e-12, name


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


@pytest.mark.parametrize("kind, match", [("glm4_moe", "an MoE model"), ("qwen2", r"target_modules \['lm_head'\]")])
def test_what_it_does_not_build_is_refused_before_any_weight_is_read(megatron_world, tmp_path, cfg, kind, match):
    tiny_hf(kind).save_pretrained(tmp_path)
    targets = "lm_head" if kind == "qwen2" else "all-linear"
    with pytest.raises(ValueError, match=match):
        MegatronTrainer(cfg(target_modules=targets, **LORA), tmp_path, pad_id=PAD)


def test_three_rollouts_of_adapters_move_the_policy_toward_reward(megatron_world, tmp_path, lm, cfg, samples):
    """Reward 1 on odd samples of each group: from the zero-B init, their mean log-prob rises and the others' falls,
    for each of three adapter inits (misc.seed); the margins measured were 0.21-0.24 up and 0.13-0.15 down."""
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
