"""The reference's whole-rollout extension points (miles_core/rollout/custom_rollout.py): rollout_function_path with
the reference's signature (args, rollout_id, data_source, evaluation=False), its data source (get_samples / add_samples
over miles' DataSource), data_source_path, disable_rollout_global_dataset and rollout_all_samples_process_path.
Unit level on the data source and the output check; the runtime ones generate one tiny rollout in process (seconds)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from miles_core.assemble import build_config
from miles_core.config import ConfigError
from miles_core.data import DataSource, Sample
from miles_core.data.dataset import Prompt
from miles_core.rollout.custom_rollout import RolloutDataSourceWithBuffer, RolloutFnTrainOutput, checked_rollout
from flows.recipes import read_recipe

B, G = 2, 4
BASE = {"rollout_batch_size": B, "n_samples_per_prompt": G, "rollout_max_response_len": 4, "num_threads": 1, "num_rollout": 2,
        "eval_prompt_data": None}
CALLS: list = []


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(text=f"p{i}", input_ids=[i + 3, i + 4], label=str(i), metadata={"row": i}) for i in range(n)]


# ---- the data source in the reference's interface ---------------------------------------------------------------

def test_get_samples_hands_out_groups_and_add_samples_hands_them_back_first():
    source = DataSource(_prompts(3), shuffle=False, seed=0)
    ds = RolloutDataSourceWithBuffer(source, G)
    ds.rollout_id = 5
    first = ds.get_samples(2)
    assert [[s.group_index for s in g] for g in first] == [[0] * G, [1] * G]
    assert [s.index for s in first[1]] == [4, 5, 6, 7] and first[1][0].tokens == [4, 5] and first[1][0].label == "1"
    assert {s.rollout_id for g in first for s in g} == {5} and first[0][0].status == Sample.Status.PENDING
    ds.add_samples(first[1:])
    assert ds.get_buffer_length() == 1
    again = ds(2)  # the reference's class form passes data_source.get_samples: the object is callable the same way
    assert again[0] is first[1] and [s.group_index for s in again[1]] == [2] * G  # the buffered group first, then prompt 2
    state = source.state_dict()
    assert state["next_group_index"] == 3 and state["offset"] == 3 and state["buffer"] == []  # what a checkpoint saves
    with pytest.raises(ValueError, match="n_samples_per_prompt=4"):
        ds.add_samples([first[0][:2]])


def test_without_a_global_dataset_groups_are_empty_samples_numbered_on_and_read_only_refuses_add_samples():
    source = DataSource([], shuffle=False, seed=0)
    ds = RolloutDataSourceWithBuffer(source, G, global_dataset=False)
    groups = ds.get_samples(2) + ds.get_samples(1)
    assert [g[0].group_index for g in groups] == [0, 1, 2] and groups[2][3].index == 11
    assert groups[0][0].tokens == [] and groups[0][0].prompt == "" and source.cursor.next_group_index == 3
    read_only = RolloutDataSourceWithBuffer(DataSource(_prompts(1), shuffle=False, seed=0), G, read_only=True)
    with pytest.raises(RuntimeError, match="read-only"):
        read_only.add_samples(read_only.get_samples(1))


def _finished(gi: int, k: int) -> Sample:
    return Sample(group_index=gi, index=gi * G + k, tokens=[1, 2, 3], response_length=1, loss_mask=[1],
                  rollout_log_probs=[-0.5], status=Sample.Status.COMPLETED)


def test_the_output_check_names_the_function():
    groups = [[_finished(gi, k) for k in range(G)] for gi in range(B)]
    got, metrics = checked_rollout("my.fn", RolloutFnTrainOutput(samples=groups, metrics={"custom/x": 2}), B, G)
    assert got is groups and metrics == {"custom/x": 2.0}
    assert checked_rollout("my.fn", groups, B, G) == (groups, {})  # the reference's legacy list return
    with pytest.raises(ValueError, match=r"rollout_function_path 'my.fn' returned 1 groups .*rollout_batch_size=2"):
        checked_rollout("my.fn", groups[:1], B, G)
    bad = [[_finished(gi, k) for k in range(G)] for gi in range(B)]
    bad[1][2].rollout_log_probs = []
    with pytest.raises(ValueError, match="'my.fn': sample 6 has 0 rollout_log_probs values"):
        checked_rollout("my.fn", bad, B, G)
    bad[1][2] = Sample(index=6)
    with pytest.raises(ValueError, match="'my.fn': sample 6 came back with status pending"):
        checked_rollout("my.fn", bad, B, G)
    with pytest.raises(ValueError, match="returned dict, expected list"):
        checked_rollout("my.fn", {"a": 1}, B, G)


# ---- config rules -------------------------------------------------------------------------------------------------

def _config(**over):
    return build_config({**read_recipe("tiny"), **BASE, **over})


@pytest.mark.parametrize("over, match", [
    ({"disable_rollout_global_dataset": True, "prompt_data": None}, "needs a rollout_function_path"),
    ({"data_source_path": f"{__name__}.MySource"}, "data_source_path .* is handed to a rollout_function_path"),
    ({"rollout_function_path": f"{__name__}.not_there"}, "rollout_function_path .*has no attribute 'not_there'"),
    ({"rollout_function_path": f"{__name__}.two_args"}, "expected the reference's \\(args, rollout_id, data_source"),
    ({"rollout_function_path": f"{__name__}.echo_rollout", "over_sampling_batch_size": 4},
     "over_sampling_batch_size configure miles' generate loop"),
    ({"rollout_function_path": f"{__name__}.echo_rollout", "data_source_path": f"{__name__}.two_args"},
     "data_source_path .* must name a class"),
    ({"rollout_function_path": f"{__name__}.echo_rollout", "eval_prompt_data": ["a", "builtin://arith-test@[0:4]"]},
     "evaluates with the rollout function"),
    ({"rollout_function_path": f"{__name__}.echo_rollout", "disable_rollout_global_dataset": True},
     "drop prompt_data"),
])
def test_refused_combinations_name_the_field(over, match):
    with pytest.raises(ConfigError, match=match):
        _config(**over)


def test_prompt_data_is_not_required_without_a_global_dataset():
    c = _config(rollout_function_path=f"{__name__}.fixed_prompt_rollout", disable_rollout_global_dataset=True, prompt_data=None)
    assert c.data.prompt_data is None
    with pytest.raises(ConfigError, match="prompt_data is required"):
        _config(prompt_data=None)


# ---- user functions (the reference's signatures) ------------------------------------------------------------------

def two_args(args, rollout_id):
    return []


def _post(args, ids: list[int], max_new_tokens: int) -> dict:
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0},
                       "return_logprob": True}).encode()
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=60) as r:
        return json.loads(r.read())


def _generated(args, s: Sample) -> Sample:
    """What a reference rollout function does with one sample: post its ids to the engines, keep ids and log-probs."""
    out = _post(args, s.tokens, args.rollout_max_response_len)
    pairs = out["meta_info"]["output_token_logprobs"]
    s.tokens = s.tokens + [p[1] for p in pairs]
    s.response_length, s.loss_mask, s.rollout_log_probs = len(pairs), [1] * len(pairs), [p[0] for p in pairs]
    s.status = Sample.Status.TRUNCATED if out["meta_info"]["finish_reason"]["type"] == "length" else Sample.Status.COMPLETED
    return s


def echo_rollout(args, rollout_id, data_source, evaluation=False):
    """Draws the rollout's groups from the data source, generates each sample over HTTP, rewards its response length; puts
    one extra group back (the next rollout gets it first)."""
    CALLS.append(("echo", rollout_id, evaluation))
    groups = data_source.get_samples(args.rollout_batch_size)
    for g in groups:
        for s in g:
            _generated(args, s)
            s.reward = float(s.response_length)
            s.metadata["by"] = "echo_rollout"
    if rollout_id == 0:
        data_source.add_samples(data_source.get_samples(1))
    return RolloutFnTrainOutput(samples=groups, metrics={"custom/groups": len(groups)})


async def fixed_prompt_rollout(args, rollout_id, data_source, evaluation=False):
    """The reference's fixed-prompt example (no global dataset): empty samples get one prompt; rewards left to the run's."""
    groups = data_source.get_samples(args.rollout_batch_size)
    for g in groups:
        for s in g:
            s.prompt, s.tokens, s.label = "2+2=", [5, 6, 7], "4"
            _generated(args, s)
    return [g for g in groups]


def wrong_batch(args, rollout_id, data_source, evaluation=False):
    return data_source.get_samples(1)


class MySource:
    """A data_source_path class of the reference's interface: the run saves and loads it with the checkpoint."""

    def __init__(self, args):
        self.args, self.drawn = args, 0

    def get_samples(self, num_samples):
        self.drawn += num_samples
        return [[Sample(group_index=self.drawn * 100 + i, index=(self.drawn * 100 + i) * G + k, tokens=[9, 10])
                 for k in range(G)] for i in range(num_samples)]

    def add_samples(self, samples):
        raise RuntimeError("read-only")

    def save(self, rollout_id):
        CALLS.append(("save", rollout_id, self.args.save, self.drawn))

    def load(self, rollout_id=None):
        CALLS.append(("load", rollout_id, self.args.load))


def _runtime(tmp_path, **over):
    from miles_core.runtime.placement import build_runtime

    rt = build_runtime(_config(run_dir=str(tmp_path / "run"), **over))
    rt.sync_weights()
    return rt


def test_rollout_function_path_replaces_the_generate_loop_and_its_samples_train(tmp_path, tiny_model_dir):
    CALLS.clear()
    rt = _runtime(tmp_path, rollout_function_path=f"{__name__}.echo_rollout")
    try:
        metrics = rt.generate(0)
        samples = rt.load_rollout(0)
        assert CALLS == [("echo", 0, False)] and len(samples) == B * G
        assert {s.metadata["by"] for s in samples} == {"echo_rollout"} and metrics["custom/groups"] == 2.0
        assert [s.reward for s in samples] == [float(s.response_length) for s in samples]  # the function's, not rm_type's
        assert all(s.weight_versions == [1] and s.rollout_id == 0 and s.response for s in samples)
        assert metrics["rollout/raw_reward"] == pytest.approx(sum(s.response_length for s in samples) / (B * G))
        assert rt.source.state_dict()["next_group_index"] == 3 and len(rt.source.buffer) == 1  # saved with a checkpoint
        out = rt.train(0)  # the trainer reads the function's samples from the rollout file
        assert out.steps and "train/loss" in out.steps[0]
        rt.generate(1)
        assert rt.load_rollout(1)[0].group_index == 2  # the group it put back came first
    finally:
        rt.close()


def test_without_a_global_dataset_the_function_makes_the_prompts(tmp_path, tiny_model_dir):
    rt = _runtime(tmp_path, rollout_function_path=f"{__name__}.fixed_prompt_rollout", disable_rollout_global_dataset=True,
                  prompt_data=None, rm_type="deterministic_random")
    try:
        rt.generate(0)
        samples = rt.load_rollout(0)
        assert rt.num_prompts == 0 and {s.prompt for s in samples} == {"2+2="}
        assert [s.group_index for s in samples[::G]] == [0, 1] and all(s.reward in (0, 1) for s in samples)  # the run's rm
    finally:
        rt.close()


def test_a_bad_return_fails_naming_the_function_and_leaves_the_cursor(tmp_path, tiny_model_dir):
    rt = _runtime(tmp_path, rollout_function_path=f"{__name__}.wrong_batch")
    try:
        with pytest.raises(ValueError, match=r"rollout_function_path 'tests.rollout.test_custom_rollout.wrong_batch' returned 1 groups"):
            rt.generate(0)
        assert rt.source.state_dict()["next_group_index"] == 0  # a retry draws the same prompts
    finally:
        rt.close()


def first_group_rollout(args, rollout_id, data_source, evaluation=False):
    groups = data_source.get_samples(args.rollout_batch_size)
    return [[_generated(args, s) for s in g] for g in groups]


def test_data_source_path_class_is_handed_over_and_saved_and_loaded_with_the_checkpoint(tmp_path, tiny_model_dir):
    CALLS.clear()
    over = {"rollout_function_path": f"{__name__}.first_group_rollout", "data_source_path": f"{__name__}.MySource",
            "rm_type": "deterministic_random"}
    rt = _runtime(tmp_path, **over)
    try:
        rt.generate(0)
        assert [s.group_index for s in rt.load_rollout(0)[::G]] == [200, 201]  # MySource's groups
        rt.train(0)
        rt.save(0, {})
    finally:
        rt.close()
    save_dir = str(tmp_path / "run" / "checkpoints")
    assert CALLS == [("save", 0, save_dir, 2)]
    again = _runtime(tmp_path, **over)
    try:
        assert again.restore()["rollout_id"] == 0 and CALLS[-1] == ("load", 0, save_dir)
    finally:
        again.close()


def drop_group_zero(args, samples):
    """A reference-style dynamic filter: drops group 0 only, so the groups examined are known."""
    from miles_core.rollout.filters import DynamicFilterOutput

    return DynamicFilterOutput(keep=samples[0].group_index != 0, reason="group_zero")


def recycle_dropped(args, all_samples, data_source):
    """rollout_all_samples_process_path: sees every examined group; hands the dropped ones back to the buffer."""
    CALLS.append(("all", args.rollout_batch_size, [g[0].group_index for g in all_samples]))
    data_source.add_samples([g for g in all_samples if g[0].group_index == 0])


def test_rollout_all_samples_process_path_sees_kept_and_dropped_groups(tmp_path, tiny_model_dir):
    """Round 0 draws groups 0, 1, 2: 0 dropped, 1 and 2 kept; the function gets all three and buffers group 0, which
    rollout 1 draws first (a buffered group is taken without partial_rollout, as the reference's data source does)."""
    CALLS.clear()
    rt = _runtime(tmp_path, rollout_all_samples_process_path=f"{__name__}.recycle_dropped", over_sampling_batch_size=3,
                  dynamic_sampling_filter_path=f"{__name__}.drop_group_zero", rm_type="deterministic_random")
    try:
        metrics = rt.generate(0)
        assert metrics["rollout/dynamic_filter/drop_group_zero"] == 1.0
        assert [s.group_index for s in rt.load_rollout(0)[::G]] == [1, 2]
        assert CALLS == [("all", B, [0, 1, 2])] and [g[0].group_index for g in rt.source.buffer] == [0]
        rt.generate(1)
        assert CALLS[1] == ("all", B, [0, 3, 4]) and [s.group_index for s in rt.load_rollout(1)[::G]] == [3, 4]
    finally:
        rt.close()
