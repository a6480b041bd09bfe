"""The trainer's tensor dumps (dumper_fwd_only / dumper_fwd_bwd, miles_core/training/dumps.py) in SGLang's dumper
layout: the forward-only pass's logits are the model's own, the forward + backward's parameter gradients are the
step's, one step per micro-batch, nothing written with the dumper off."""

from __future__ import annotations

import copy

import pytest
import torch

from flows.recipes import load_config
from miles_core.training.torch_trainer import TorchTrainer
from ._samples import uneven_samples

REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]


def _tags(path) -> dict[str, str]:
    """A dump file's name as SGLang's dump_loader.parse_meta_from_filename reads it: key=value joined by ___."""
    return dict(kv.split("=", 1) for kv in path.stem.split("___"))


def _by_name(exp_dir) -> dict[tuple[str, int], dict]:
    out = {}
    for p in sorted(exp_dir.glob("*.pt")):
        tags = _tags(p)
        out[(tags["name"], int(tags["step"]))] = {"tags": tags, **torch.load(p, weights_only=False)}
    return out


@pytest.fixture(scope="module")
def dumped(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    """One rollout of 8 samples, 2 optimizer steps (so the old-policy pass runs), micro-batches of 4."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("dumps")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    initial = copy.deepcopy(model)
    cfg = load_config("tiny", {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_steps_per_rollout": 2,
                               "micro_batch_size": 4, "clip_grad": 0.0, "dumper_enable": True, "dumper_dir": str(root),
                               "dumper_fwd_only": ["non_intrusive_mode=all", "filter=layer_id is None"],
                               "dumper_fwd_bwd": ["enable_model_grad=true", "enable_model_value=1"]})
    trainer = TorchTrainer(model, cfg, pad_id=tiny_tokenizer.pad_token_id)
    trainer.train_rollout(uneven_samples(tiny_tokenizer), REWARDS, 3)
    return root, model, initial


def test_the_forward_only_dump_holds_each_micro_batch_s_inputs_and_the_model_s_logits(dumped, tiny_tokenizer):
    from miles_core.training.batch import make_batch

    root, _, initial = dumped
    dumps = _by_name(root / "fwd_only" / "rollout_3")
    steps = sorted({s for _, s in dumps})
    assert steps == [0, 1]  # 8 rows in micro-batches of 4
    batch = make_batch(uneven_samples(tiny_tokenizer), tiny_tokenizer.pad_token_id)
    for step in steps:
        ids, pos = dumps["input_ids", step]["value"], dumps["position_ids", step]["value"]  # the core fields
        mask = dumps["non_intrusive__model.inputs.attention_mask", step]["value"]
        with torch.no_grad():  # the base model on the dumped inputs, with the weights the pass ran with
            hidden = initial.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        assert torch.allclose(dumps["non_intrusive__model.norm.output", step]["value"], hidden, atol=1e-5)
        logits = dumps["non_intrusive__lm_head.output", step]  # [4, t, V]: the positions predicting the responses
        piece = batch.slice(4 * step, 4 * step + 4)
        with torch.no_grad():  # the old-policy log-probs of these rows by a direct forward of the initial model
            direct = TorchTrainer(copy.deepcopy(initial), load_config("tiny", {}), pad_id=0).engine.compute_log_probs(initial, piece)
        logp = torch.log_softmax(logits["value"].float(), -1).gather(-1, piece.resp_tokens[..., None])[..., 0]  # temperature 1
        assert logits["value"].shape == (*piece.resp_tokens.shape, initial.config.vocab_size)
        assert torch.allclose(logp * piece.loss_mask, direct * piece.loss_mask, atol=1e-5)
        assert logits["tags"]["rank"] == "0" and logits["tags"]["recompute_status"] == "disabled"
        meta = logits["meta"]  # SGLang's payload: {value, meta: the name's tags + static meta}
        assert meta["name"] == "non_intrusive__lm_head.output" and meta["step"] == step
        assert (meta["world_rank"], meta["world_size"]) == (0, 1)
    assert not any("layer_id" in d["tags"] for d in dumps.values())  # the filter kept only what runs outside a layer
    assert not any(n.startswith("param__") for n, _ in dumps)  # enable_model_value is the fwd_bwd phase's here


def test_the_forward_backward_dump_holds_the_last_step_s_parameters_and_gradients(dumped):
    root, model, _ = dumped
    dumps = _by_name(root / "fwd_bwd" / "rollout_3")  # the second step's: each step replaces the rollout's dir
    params = dict(model.named_parameters())
    grads = {n.removeprefix("grad__param__"): d["value"] for (n, s), d in dumps.items() if n.startswith("grad__param__")}
    assert set(grads) == set(params) and all(s == 0 for n, s in dumps if n.startswith(("param__", "grad__")))
    for name, p in params.items():  # the gradients before the update (clip_grad 0: not clipped), as .grad still holds them
        assert torch.equal(grads[name], p.grad), name
    assert {s for n, s in dumps if n == "input_ids"} == {0}  # the step's 4 rows: one micro-batch (core mode)
    values = {n.removeprefix("param__"): d["value"] for (n, _), d in dumps.items() if n.startswith("param__")}
    assert {n: v.shape for n, v in values.items()} == {n: p.shape for n, p in params.items()}
    assert not all(torch.equal(values[n], p) for n, p in params.items())  # dumped before the update moved them
    assert not (root / "fwd_only" / "ref_rollout_3").exists()  # no reference model in this run


def test_nothing_is_dumped_with_the_dumper_off(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = load_config("tiny", {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_steps_per_rollout": 2,
                               "micro_batch_size": 4, "dumper_dir": str(tmp_path / "d"), "run_dir": str(tmp_path / "run")})
    trainer = TorchTrainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg, pad_id=tiny_tokenizer.pad_token_id)
    trainer.train_rollout(uneven_samples(tiny_tokenizer), REWARDS, 0)
    assert not (tmp_path / "d").exists() and not list(tmp_path.rglob("*.pt"))
    default = load_config("tiny", {"run_dir": str(tmp_path / "run")})
    assert default.dumper_root == tmp_path / "run" / "dumper"  # the reference's /tmp/dumper: inside the run dir here


PATCH = """patches:
  - target: transformers.models.qwen2.modeling_qwen2.Qwen2MLP.forward
    edits:
      - match: "return down_proj"
        prepend: "dumper.dump('mlp_output', down_proj, dims='b t h')"
"""


def test_a_source_patch_dumps_what_its_yaml_names_inside_the_trainer_s_phases(tiny_model_dir, tiny_tokenizer, tmp_path):
    """dumper_source_patcher_config_train: SGLang's patch format, the edited function dumping into the current phase."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    original = Qwen2MLP.forward.__code__
    (tmp_path / "patch.yaml").write_text(PATCH)
    cfg = load_config("tiny", {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_steps_per_rollout": 2,
                               "micro_batch_size": 8, "dumper_enable": True, "dumper_dir": str(tmp_path / "d"),
                               "dumper_source_patcher_config_train": str(tmp_path / "patch.yaml"),
                               "dumper_fwd_only": ["filter=name == 'mlp_output'"], "dumper_fwd_bwd": ["enable=false"]})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = TorchTrainer(model, cfg, pad_id=tiny_tokenizer.pad_token_id)
    try:
        assert Qwen2MLP.forward.__code__ is not original
        with torch.no_grad():  # outside a phase the patched code dumps nothing
            model(input_ids=torch.tensor([[5, 6, 7]]))
        assert not (tmp_path / "d").exists()
        trainer.train_rollout(uneven_samples(tiny_tokenizer), REWARDS, 0)
    finally:
        trainer.dumps.patches.restore()
    assert Qwen2MLP.forward.__code__ is original
    dumps = [(_tags(p), torch.load(p, weights_only=False)) for p in (tmp_path / "d" / "fwd_only" / "rollout_0").glob("*.pt")]
    assert sorted(int(t["layer_id"]) for t, _ in dumps) == list(range(model.config.num_hidden_layers))  # one per layer
    assert all(t["name"] == "mlp_output" and d["meta"]["dims"] == "b t h" for t, d in dumps)
    assert all(d["value"].shape[-1] == model.config.hidden_size for _, d in dumps)
    assert not (tmp_path / "d" / "fwd_bwd").exists()


@pytest.mark.parametrize(("values", "match"), [
    ({}, "dumper_source_patcher_config_train applies only with dumper_enable"),
    ({"dumper_enable": True, "dumper_source_patcher_config_train": "missing.yaml"}, "missing.yaml is not a file"),
])
def test_a_source_patch_file_is_checked_at_load_naming_the_field(values, match, tmp_path):
    values = {"dumper_source_patcher_config_train": str(tmp_path / "p.yaml"), **values}
    (tmp_path / "p.yaml").write_text(PATCH)
    with pytest.raises(ValueError, match=match):
        load_config("tiny", values)
    (tmp_path / "p.yaml").write_text("patches:\n  - target: x\n    edits: []\n    extra: 1\n")
    with pytest.raises(ValueError, match="is not a source-patcher YAML"):
        load_config("tiny", {"dumper_enable": True, "dumper_source_patcher_config_train": str(tmp_path / "p.yaml")})
