"""custom_generate_function_path: resolved at config load (typos and bad signatures fail there);
our (ctx, sample) signature batches the samples' engine calls and seeds them per sample; a
reference-style (args, sample, sampling_params) file, posting to args.sglang_router_ip/port, runs
through `miles train`."""

from __future__ import annotations

import textwrap

import pytest
from typer.testing import CliRunner

from flows.recipes import load_config
from miles_core.config import ConfigError
from miles_core.data.sample import Sample, Status
from miles_core.rollout.generate import RolloutSpec, generate_unfinished
from miles_core.rollout.multi_turn import TurnSpec, resolve_generate_function
from miles_core.rollout.protocol import SamplingParams

REFERENCE_STYLE = '''
import httpx

from miles_core.data.sample import Sample  # the reference's: from miles.utils.types import Sample


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    payload = {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True}
    async with httpx.AsyncClient() as client:
        output = (await client.post(url, json=payload, timeout=60)).json()
    entries = output["meta_info"]["output_token_logprobs"]
    sample.tokens = sample.tokens + [t for _, t, _ in entries]
    sample.response_length += len(entries)
    sample.loss_mask = sample.loss_mask + [1] * len(entries)
    sample.rollout_log_probs = sample.rollout_log_probs + [lp for lp, _, _ in entries]
    sample.weight_versions = sample.weight_versions + [int(output["meta_info"]["weight_version"])]
    sample.metadata["max_new_tokens_seen"] = sampling_params["max_new_tokens"] + (args.rollout_batch_size - args.rollout_batch_size)
    finish = output["meta_info"]["finish_reason"]["type"]
    sample.status = {"stop": Sample.Status.COMPLETED, "length": Sample.Status.TRUNCATED}.get(finish, Sample.Status.ABORTED)
    return sample
'''

RECIPE = '''
hf_checkpoint: builtin://tiny-qwen2
prompt_data: builtin://arith
rm_type: math
rollout_batch_size: 4
n_samples_per_prompt: 4
num_rollout: 2
rollout_max_response_len: 12
custom_generate_function_path: ref_generate.generate
seed: 1234
'''


async def ours(ctx, sample):
    """Two engine calls per sample: a first turn, then a continuation of it."""
    first = await ctx.generate(sample.tokens, max_new_tokens=2)
    second = await ctx.generate(sample.tokens + first.output_ids, max_new_tokens=ctx.budget - len(first.output_ids))
    ids, lps = first.output_ids + second.output_ids, first.output_log_probs + second.output_log_probs
    sample.tokens, sample.response_length = sample.tokens + ids, len(ids)
    sample.loss_mask, sample.rollout_log_probs = [1] * len(ids), lps
    sample.weight_versions, sample.status = [first.weight_version, second.weight_version], Status.COMPLETED
    return [sample]


def not_async(args, sample, sampling_params):
    return sample


async def four(a, b, c, d):
    return a


@pytest.mark.parametrize("path, says", [
    ("tests.rollout.test_custom_generate.nope", "has no attribute 'nope'"),
    ("no_such_module.generate", "cannot import module 'no_such_module'"),
    ("tests.rollout.test_custom_generate.not_async", "must be an async function"),
    ("tests.rollout.test_custom_generate.four", "got 4 required parameters"),
])
def test_a_bad_function_fails_at_config_load(path, says):
    with pytest.raises(ConfigError, match=says):
        load_config("tiny", {"custom_generate_function_path": path, "eval_prompt_data": None})


def test_config_refuses_what_would_be_ignored():
    with pytest.raises(ConfigError, match="generate_tool_call_parser apply only with custom_generate_function_path"):
        load_config("tiny", {"generate_tool_call_parser": "qwen25"})
    with pytest.raises(ConfigError, match="evaluation with custom_generate_function_path is not supported yet"):
        load_config("tiny", {"custom_generate_function_path": "multi_turn", "apply_chat_template": True})
    with pytest.raises(ConfigError, match="generate_tool_call_parser 'pythonic' is not known"):
        load_config("tiny-tools", {"generate_tool_call_parser": "pythonic"})
    assert resolve_generate_function("miles.rollout.generate_hub.multi_turn.generate").style == "builtin"


class Recording:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate_seeded(self, requests, seeds):
        self.calls.append(len(requests))
        return self.inner.generate_seeded(requests, seeds)

    def get_weight_version(self):
        return self.inner.get_weight_version()


def test_our_signature_batches_calls_and_is_reproducible(engine, tiny_tokenizer, tiny_model_dir):
    turns = TurnSpec(generate_function="tests.rollout.test_custom_generate.ours", tokenizer_path=str(tiny_model_dir))
    spec = RolloutSpec(rollout_batch_size=2, n_samples_per_prompt=3, turns=turns,
                       params=SamplingParams(max_new_tokens=8, stop_token_ids=(tiny_tokenizer.eos_token_id,)))
    runs = []
    for _ in range(2):
        groups = [[Sample(index=g * 3 + k, group_index=g, tokens=tiny_tokenizer(q)["input_ids"]) for k in range(3)] for g, q in enumerate(["2+3=", "7-4="])]
        rec = Recording(engine)
        generate_unfinished(rec, groups, spec, seed=5, decode=tiny_tokenizer.decode)
        assert rec.calls == [6, 6]  # the six samples' first calls in one engine call, their second calls in another
        runs.append([(s.tokens, s.rollout_log_probs) for g in groups for s in g])
    assert runs[0] == runs[1]
    assert len({tuple(t) for t, _ in runs[0][:3]}) > 1  # seeded per sample: the samples of a group differ


@pytest.mark.usefixtures("prefect_harness")
def test_a_reference_style_function_file_runs_through_miles_train(tmp_path, monkeypatch, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    from flows.cli import app

    (tmp_path / "ref_generate.py").write_text(textwrap.dedent(REFERENCE_STYLE))
    (tmp_path / "ref.yaml").write_text(RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "ref.yaml"), "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    import torch

    saved = torch.load(run_dir / "rollouts" / "1.pt", weights_only=False)
    assert len(saved["samples"]) == 16
    for d in saved["samples"]:
        s = Sample.from_dict(d)
        assert s.metadata["max_new_tokens_seen"] == 12 and s.weight_versions == [2]  # one sync before rollout 0, one after it
        assert len(s.rollout_log_probs) == s.response_length > 0 and s.status in (Status.COMPLETED, Status.TRUNCATED)
    cfg = load_config(str(tmp_path / "ref.yaml"), {"run_dir": str(run_dir)})
    client = MlflowClient(cfg.tracking_uri)
    run = client.search_runs(client.get_experiment_by_name(cfg.tracking.mlflow_experiment_name).experiment_id)[0]
    assert run.info.status == "FINISHED" and run.data.params["rollout.custom_generate_function_path"] == "ref_generate.generate"
    assert {m.step for m in client.get_metric_history(run.info.run_id, "multi_turn/multi_turn_metric/round_number_mean")} == {0, 1}
