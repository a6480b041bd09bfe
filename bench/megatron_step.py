"""Megatron vs torch trainer: seconds per GRPO train step on CPU, both in one run, alternating.

Shapes: ``tiny`` (the builtin tiny-qwen2: hidden 256, 4 layers, vocab 512) and ``smollm2`` (SmolLM2-135M:
hidden 576, 30 layers, 9 heads / 3 kv heads, ffn 1536, vocab 49152), random weights built here (the step
time does not depend on them). One rollout of B x G samples with P prompt and T response tokens, one
optimizer step. A plain shape (``smollm2=4x4x16x32``) runs with use_rollout_logprobs on both sides and
micro-batches of G samples (no old-policy pass, so both run exactly one forward and one backward of the same
samples: equal math up to the torch trainer packing a group's shared prompt once, which is in its favour). A
``@flow`` shape (``smollm2@flow=8x4x70x10``: the smollm2-135m recipe's 8 prompts x 4 samples, its 70-token chat
prompts and <= 10-token answers) trains as that recipe does through the flow: the recipe's micro_batch_size (16),
data_pad_size_multiplier at its default (128), the rollout log-probs not used, so each trainer decides whether the
old-policy pass is needed (rl_step.on_policy). Figures: median seconds per step per side and the paired ratio
megatron / torch.
"""

from __future__ import annotations

import random
import shutil
import time

from .common import TMP, Result, fmt_stat, paired_ratio, summarize, table

SHAPES = {
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    vocab_size=49152, tie_word_embeddings=True),
}


def _samples(n_prompts: int, group: int, prompt_len: int, resp_len: int, vocab: int):
    from miles_core.data.sample import Sample, Status

    rng = random.Random(0)
    out = []
    for g in range(n_prompts):
        prompt = [rng.randrange(2, vocab) for _ in range(prompt_len)]
        for k in range(group):
            resp = [rng.randrange(2, vocab) for _ in range(rng.randint(resp_len // 2, resp_len))]
            out.append(Sample(group_index=g, index=g * group + k, tokens=prompt + resp, response_length=len(resp),
                              loss_mask=[1] * len(resp), rollout_log_probs=[-3.0] * len(resp), reward=float(k % 2),
                              status=Status.COMPLETED, weight_versions=[0]))
    return out


FLOW = {"micro_batch_size": 16}  # the smollm2-135m recipe's train settings that differ from the defaults


def _one_shape(key: str, shape: str, repeats: int) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from miles_core.assemble import build_config
    from miles_core.training.megatron.trainer import MegatronTrainer
    from miles_core.training.torch_trainer import TorchTrainer

    name, _, mode = key.partition("@")
    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(**SHAPES[name], max_position_embeddings=512, pad_token_id=0)).eval()
    model_dir = TMP / f"megatron_step_{name}"
    shutil.rmtree(model_dir, ignore_errors=True)
    hf.save_pretrained(model_dir)
    B, G, P, T = (int(x) for x in shape.split("x"))
    if mode not in ("", "flow"):
        raise ValueError(f"shape {key}: the mode after @ is flow or nothing")
    train = FLOW if mode == "flow" else {"micro_batch_size": G, "use_rollout_logprobs": True}
    cfg = build_config({"prompt_data": "unused.jsonl", "hf_checkpoint": str(model_dir), "rollout_batch_size": B, "n_samples_per_prompt": G,
                        "lr": 1e-6, **train})
    samples, rewards = _samples(B, G, P, T, SHAPES[name]["vocab_size"]), None
    rewards = [s.reward for s in samples]
    torch_trainer, mega = TorchTrainer(hf, cfg, pad_id=0), MegatronTrainer(cfg, model_dir, pad_id=0)
    times: dict[str, list[float]] = {"torch": [], "megatron": []}
    for i in range(repeats + 1):  # the first pair warms up
        for side, step in (("torch", lambda: torch_trainer.train_rollout(samples, rewards)), ("megatron", lambda: mega.train_rollout(samples, rewards))):
            t0 = time.perf_counter()
            step()
            if i:
                times[side].append(time.perf_counter() - t0)
    on_policy = {"torch": torch_trainer.on_policy, "megatron": mega.on_policy}
    mega.close()
    shutil.rmtree(model_dir, ignore_errors=True)
    return {"torch_s": summarize(times["torch"]), "megatron_s": summarize(times["megatron"]),
            "ratio": paired_ratio(times["megatron"], times["torch"]), "tokens": sum(len(s.tokens) for s in samples),
            "train_settings": train, "old_logprob_pass_skipped": on_policy}


def bench(shapes: dict[str, str], repeats: int) -> Result:
    figures = {name: _one_shape(name, shape, repeats) for name, shape in shapes.items()}
    rows = [[name, shapes[name], fmt_stat(f["torch_s"], " s"), fmt_stat(f["megatron_s"], " s"), fmt_stat(f["ratio"], "x")]
            for name, f in figures.items()]
    notes = [
        "One GRPO optimizer step per rollout; plain shapes with use_rollout_logprobs and micro-batches of G samples (one "
        "forward + backward per side), @flow shapes with the smollm2-135m recipe's train settings (micro_batch_size 16, "
        "data_pad_size_multiplier 128, on-policy: the old-policy pass skipped where the trainer replays the step); "
        "paired ratio = megatron / torch.",
        "Both trainers compute a group's shared prompt once (the torch trainer's packed units; the Megatron local spec's "
        "shared-prompt THD sequences) and runs its LM head at the response positions only (the torch trainer by "
        "vocabulary slices, with attention per unit; the Megatron trainer its output layer on the picked hidden states, "
        "training/megatron/batching.py output_at_responses).",
        "Megatron on CPU runs the local layer spec (unfused torch ops; packed rows as THD, attention inside each sample: "
        "training/megatron/attention.py) under a one-rank gloo group; its DDP copies gradients into a flat buffer.",
    ]
    return Result(bench="megatron_step", config={"shapes": shapes, "repeats": repeats},
                  figures=figures, ratios={k: f["ratio"] for k, f in figures.items()}, notes=notes,
                  tables=[table(["shape", "BxGxPxT", "torch s/step", "megatron s/step", "megatron/torch"], rows)],
                  extra_packages=("megatron-core",))
