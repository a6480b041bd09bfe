"""Response log-probs and entropy from Megatron logits, vocab-parallel under TP.

The output layer of a TP group holds a V/TP slice of the vocab on each rank; the log-softmax is
taken over the whole vocab without gathering it: logZ = log sum_ranks sum_v exp(l_v) (max-shifted),
log p(y) = l_y - logZ with l_y read on the rank that owns y (megatron's vocab_parallel_cross_entropy,
which carries the gradient). Entropy H = logZ - sum_v p_v l_v, the sums all-reduced over TP (identity
backward, as megatron's reduce_from_tensor_model_parallel_region). With TP = 1 both are the plain
formulas (algorithms.entropy_from_logits). Logits are divided by the rollout temperature first
(REFERENCE §2), in float32.
"""

from __future__ import annotations

import torch

from miles_core.algorithms import entropy_from_logits


def _tp_size() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_world_size()


PADDED = -1e30  # a padded vocab column's logit: exp() is 0 and 0 * PADDED is 0 (entropy stays finite)


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """logits [..., V/TP] of this rank's vocab slice -> the columns at global ids >= vocab_size (the padding
    of padded_vocab_size) set to PADDED, so they take no probability and no gradient."""
    from megatron.core import parallel_state as ps

    width = logits.shape[-1]
    first = ps.get_tensor_model_parallel_rank() * width
    if first + width <= vocab_size:
        return logits
    ids = torch.arange(first, first + width, device=logits.device)
    return logits.masked_fill(ids >= vocab_size, PADDED)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [..., V/TP] (already / temperature, float32), targets [...] global ids -> log p(target) [...]."""
    if _tp_size() == 1:
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    return -vocab_parallel_cross_entropy(logits.clone(), targets)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy [...] of softmax over the whole vocab of logits [..., V/TP] (float32, / temperature)."""
    if _tp_size() == 1:
        return entropy_from_logits(logits)
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    top = logits.detach().max(dim=-1, keepdim=True).values
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    z = logits - top  # [..., V/TP]
    sum_exp = reduce_from_tensor_model_parallel_region(z.exp().sum(-1))
    weighted = reduce_from_tensor_model_parallel_region((z.exp() * z).sum(-1))
    return sum_exp.log() - weighted / sum_exp
