"""A generate attempt that fails half-way (the engine dies after the prompts were drawn) leaves the data
cursor and the partial-rollout buffer as they were, so the retry draws the prompts (and the buffered
groups) a run without the failure draws: sampling is seeded per rollout id, the cursor is the only state."""

from __future__ import annotations

from flows.recipes import load_config


class _DiesOnce:
    """The real engine, but its first generate call raises (as an engine crash mid-rollout does)."""

    def __init__(self, engine):
        self.engine, self.failed = engine, False

    def generate(self, requests, seed):
        if not self.failed:
            self.failed = True
            raise ConnectionError("engine died")
        return self.engine.generate(requests, seed)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_failed_generate_restores_the_cursor_and_buffer(tmp_path):
    import pytest

    from miles_core.runtime.placement import build_runtime

    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "rollout_batch_size": 2, "n_samples_per_prompt": 2,
                               "rollout_max_response_len": 4, "over_sampling_batch_size": 3, "partial_rollout": True,
                               "eval_prompt_data": None, "num_threads": 1})
    rt = build_runtime(cfg)
    try:
        rt.sync_weights()
        rt.generate(0)  # leaves a buffered group (over-sampling 3 for 2)
        before = rt.source.state_dict()
        assert before["buffer"]
        real = rt.fleet._engine
        rt.fleet._engine = _DiesOnce(real)
        with pytest.raises(ConnectionError):
            rt.generate(1)
        assert rt.source.state_dict() == before  # the attempt took prompts and the buffered group: both back
        assert not rt.rollouts.exists(1)
        rt.fleet._engine = real
        rt.generate(1)
        assert rt.source.state_dict() != before and rt.rollouts.exists(1)  # the retry drew from the restored cursor
    finally:
        rt.close()
