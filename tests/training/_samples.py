"""The trainer tests' batch: ``n_groups`` prompts of ``group`` responses each, of uneven lengths."""

from __future__ import annotations

from miles_core.data.sample import Sample


def uneven_samples(tok, n_groups: int = 2, group: int = 4) -> list[Sample]:
    out = []
    for g in range(n_groups):
        prompt = tok(f"{g}+1=")["input_ids"]
        for k in range(group):
            resp = tok("\\boxed{" + str(g + 1 + (k % 2)) + "}")["input_ids"][: 3 + k % 3]  # uneven lengths
            out.append(Sample(group_index=g, index=g * group + k, tokens=prompt + resp, response_length=len(resp),
                              loss_mask=[1] * len(resp), rollout_log_probs=[-1.0] * len(resp)))
    return out
