"""GRPO arithmetic: group-relative advantages and the clipped-ratio loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float) -> torch.Tensor:
    """(reward - group mean) / (group std + eps), groups given by a per-response group id.

    Population std, so a group of one (or of equal rewards) gets advantage 0, not NaN.
    """
    adv = torch.zeros_like(rewards)
    for g in torch.unique(groups):
        member = groups == g
        r = rewards[member]
        adv[member] = (r - r.mean()) / (r.std(correction=0) + eps)
    return adv


@dataclass
class LossSums:
    """Sums over this worker's responses; the caller normalises after the all-reduce."""

    loss: torch.Tensor      # differentiable: sum over responses of per-response loss
    kl: torch.Tensor        # sum over responses of (sum_t kl_t) / T
    clipped: torch.Tensor   # tokens whose ratio was clipped
    tokens: torch.Tensor    # response tokens


def clipped_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                 clip: float, ref_logp: torch.Tensor | None, kl_coef: float) -> LossSums:
    """PPO clipped surrogate per token (+ k3 KL to the reference), summed per response / T.

    Dividing by the fixed response budget T (not each response's length, not the batch's token
    count) keeps the loss a plain sum over responses, so gradients averaged over data-parallel
    workers and divided by the mean response count equal the single-worker gradient exactly.
    """
    steps = logp.shape[1]
    maskf = mask.float()
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    per_token = -surrogate
    kl = torch.zeros((), device=logp.device)
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl_tok = torch.exp(delta) - delta - 1  # k3 estimator: unbiased, always >= 0
        per_token = per_token + kl_coef * kl_tok
        kl = (kl_tok.detach() * maskf).sum() / steps
    clipped = (((ratio - 1).abs() > clip).float() * maskf).sum().detach()
    return LossSums((per_token * maskf).sum() / steps, kl, clipped, maskf.sum())
