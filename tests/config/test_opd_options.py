"""The OPD teacher and top-k options at load: what applies with what, refused with the field and the fix."""

from __future__ import annotations

import pytest

from miles_core.assemble import build_config

BASE = {"hf_checkpoint": "unused", "prompt_data": "unused.jsonl", "rollout_batch_size": 2, "n_samples_per_prompt": 4,
        "num_steps_per_rollout": 1}
URLS = ["math=http://127.0.0.1:30001/generate", "code=http://127.0.0.1:30002/generate?x=1"]


def load(**kw):
    return build_config({**BASE, **kw})


def test_accepted():
    c = load(use_opd=True, opd_type="sglang", opd_teacher_urls=URLS, opd_log_prob_top_k=4, opd_top_k_strategy="xor",
             opd_reward_weight_mode="teacher_p", opd_teacher_key="domain")
    assert c.algo.opd_teacher_urls == URLS
    load(use_opd=True, opd_teacher_load="unused", opd_log_prob_top_k=2, opd_top_k_strategy="union")


@pytest.mark.parametrize("kw,match", [
    ({"opd_teacher_urls": URLS}, "opd_teacher_urls is set but use_opd is not"),
    ({"use_opd": True, "opd_type": "sglang", "opd_teacher_urls": ["math"]}, "expected NAME=URL"),
    ({"use_opd": True, "opd_type": "sglang", "opd_teacher_urls": URLS + ["math=http://x/generate"]}, "'math' twice"),
    ({"use_opd": True, "opd_teacher_load": "unused", "opd_teacher_urls": URLS}, "needs opd_type sglang and no opd_teacher_load"),
    ({"use_opd": True, "opd_type": "sglang", "opd_teacher_urls": URLS, "rollout_temperature": 0.7}, "rollout_temperature 1"),
    ({"use_opd": True, "opd_type": "sglang", "opd_teacher_key": "domain"}, "opd_teacher_key .*add opd_teacher_urls"),
    ({"use_opd": True, "opd_teacher_load": "unused", "opd_top_k_strategy": "union"}, "opd_top_k_strategy applies to top-k OPD only"),
    ({"use_opd": True, "opd_type": "sglang", "opd_log_prob_top_k": 4}, "opd_log_prob_top_k needs a teacher that answers top-k"),
    ({"use_opd": True, "opd_type": "sglang", "opd_teacher_load": "unused", "opd_log_prob_top_k": 4}, "answers top-k"),
    ({"use_opd": True, "opd_teacher_load": "unused", "opd_log_prob_top_k": 2, "train_backend": "megatron"},
     "opd_log_prob_top_k is not supported with train_backend megatron"),
    ({"use_opd": True, "opd_teacher_load": "unused", "opd_log_prob_top_k": -1}, "opd_log_prob_top_k"),
    ({"use_opd": True, "opd_teacher_load": "unused", "opd_top_k_strategy": "all"}, "opd_top_k_strategy"),
    ({"use_opd": True, "opd_teacher_load": "unused", "opd_topk_per_position": True}, "token_ids_logprob_positions"),
])
def test_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        load(**kw)
