"""On-policy distillation (OPD): a reverse-KL penalty towards a teacher folded into the advantages.

    A_t <- A_t - opd_kl_coef * kl_t * m_t

Sampled-token OPD (opd_log_prob_top_k 0): kl_t = logp_old_t - logp_teacher_t, the k1 estimate of
KL(pi_old || pi_teacher) on the sampled token, so the policy is pushed towards tokens the teacher finds likelier.

Top-k OPD (opd_log_prob_top_k k > 0; the reference's "Rethinking On-Policy Distillation" recipe,
miles/rollout/on_policy_distillation.py _compute_topk_reverse_kl): at each response position, with S the k
likeliest tokens of the student (old policy) and T the teacher's k likeliest, a token set by opd_top_k_strategy

    only-student S    only-teacher T    intersection S & T    union S | T    xor S ^ T

and, over the set, kl_t = sum_i w_i * (logp_student(i) - logp_teacher(i)) with the weights of opd_reward_weight_mode

    student_p  softmax over the set of logp_student     teacher_p  softmax over the set of logp_teacher
    none       uniform 1 / |set|

except for xor, whose weights are not normalised: exp(logp_student), exp(logp_teacher), or 1 (the reference's
normalize = strategy != "xor"). An empty set (intersection) gives kl_t = 0.
``topk_position_kl`` is that formula at one position over token-id maps (a teacher behind HTTP answers top-k lists);
``topk_reverse_kl`` the same over full distributions [N, T, V] (an in-process teacher), vectorised.

It applies after any estimator and before `normalize_advantages`; ppo returns (critic targets) are left unchanged.
Logged as train/opd_reverse_kl (sampled-token: R(logp - logp_teacher) with the current policy; top-k: R(kl)) by
the actor loss, and as rollout/opd_reverse_kl (token mean of kl) by compute_advantages.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch
from torch import Tensor

from .ops import masked_mean

TOP_K_STRATEGIES = ("only-student", "only-teacher", "intersection", "union", "xor")
REWARD_WEIGHT_MODES = ("student_p", "teacher_p", "none")
STUDENT_TOP = frozenset(TOP_K_STRATEGIES) - {"only-teacher"}  # strategies that read the student's top-k
TEACHER_TOP = frozenset(TOP_K_STRATEGIES) - {"only-student"}  # ... the teacher's top-k
TEACHER_ON_STUDENT = frozenset({"only-student", "union", "xor"})  # ... the teacher's log-probs of the student's ids


def apply_opd(
    advantages: Tensor, reverse_kl: Tensor, loss_mask: Tensor, coef: float
) -> tuple[Tensor, dict[str, float]]:
    """advantages, reverse_kl (kl_t: sampled_token_kl or a top-k estimate), loss_mask [N, T] -> (shifted advantages
    [N, T], metrics)."""
    reverse_kl = reverse_kl * loss_mask  # [N, T]
    shifted = advantages - coef * reverse_kl
    return shifted, {"opd_reverse_kl": float(masked_mean(reverse_kl, loss_mask))}


def sampled_token_kl(old_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """[N, T] logp_old - logp_teacher of the sampled tokens."""
    return old_log_probs - teacher_log_probs


def selected_ids(strategy: str, student_ids: Sequence[int], teacher_ids: Sequence[int]) -> list[int]:
    """The token set of one position (student ids first, then the teacher's, each once)."""
    s, t = set(student_ids), set(teacher_ids)
    if strategy == "only-student":
        return list(student_ids)
    if strategy == "only-teacher":
        return list(teacher_ids)
    if strategy == "intersection":
        return [i for i in student_ids if i in t]
    both = list(dict.fromkeys([*student_ids, *teacher_ids]))
    if strategy == "union":
        return both
    if strategy == "xor":
        return [i for i in both if (i in s) != (i in t)]
    raise ValueError(f"opd_top_k_strategy {strategy!r}: expected one of {TOP_K_STRATEGIES}")


def topk_position_kl(strategy: str, mode: str, student_ids: Sequence[int], teacher_ids: Sequence[int],
                     student_logp: Mapping[int, float], teacher_logp: Mapping[int, float]) -> float:
    """kl_t of one position: student_ids / teacher_ids the two top-k lists, *_logp each side's log-prob of every
    token of the set (a KeyError names a token the teacher was not asked about)."""
    ids = selected_ids(strategy, student_ids, teacher_ids)
    if not ids:
        return 0.0
    s = [float(student_logp[i]) for i in ids]
    t = [float(teacher_logp[i]) for i in ids]
    logw = {"student_p": s, "teacher_p": t, "none": [0.0] * len(ids)}[mode]
    if strategy == "xor":
        w = [math.exp(x) for x in logw]
    else:
        top = max(logw)
        e = [math.exp(x - top) for x in logw]
        w = [x / sum(e) for x in e]
    return sum(wi * (si - ti) for wi, si, ti in zip(w, s, t))


def topk_reverse_kl(student_logp: Tensor, teacher_logp: Tensor, k: int, strategy: str, mode: str) -> Tensor:
    """student_logp, teacher_logp [N, T, V] full log-distributions -> kl [N, T] (topk_position_kl at every position)."""
    def top_mask(logp: Tensor) -> Tensor:
        return torch.zeros_like(logp, dtype=torch.bool).scatter_(-1, logp.topk(min(k, logp.shape[-1]), dim=-1).indices, True)

    s_in, t_in = top_mask(student_logp), top_mask(teacher_logp)  # [N, T, V]
    chosen = {"only-student": s_in, "only-teacher": t_in, "intersection": s_in & t_in, "union": s_in | t_in,
              "xor": s_in ^ t_in}[strategy]
    logw = {"student_p": student_logp, "teacher_p": teacher_logp, "none": torch.zeros_like(student_logp)}[mode]
    if strategy == "xor":
        w = torch.where(chosen, logw.exp(), 0.0)
    else:
        w = torch.softmax(logw.masked_fill(~chosen, float("-inf")), dim=-1).nan_to_num(0.0)  # an empty set: 0
    diff = torch.where(chosen, student_logp - teacher_logp, 0.0)
    return (w * diff).sum(-1)  # [N, T]
