"""Rollout decoding with a KV cache, and the matching teacher-forced log-probs for training.

Sampling is inverse-CDF on uniforms drawn up front from per-prompt generators, so a response
depends only on its prompt's seed and the weights: not on the batch it was decoded in, the shard
layout or the device's RNG. Log-probs are of the sampling distribution softmax(logits / T), in
both the rollout and the trainer, so the first PPO ratio is 1 up to float noise.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import PreTrainedModel


@dataclass
class Decoded:
    response_ids: torch.Tensor   # [n, T] int64, PAD after the end
    response_mask: torch.Tensor  # [n, T] bool, True up to and including EOS
    logprobs: torch.Tensor       # [n, T] float32, 0 where masked


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.2x renamed ``past_key_values`` to ``cache``; older releases only know the former.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _keep_last(model: PreTrainedModel, n: int) -> dict[str, int]:
    """Ask for the logits of the last ``n`` positions only, when the model can (HF ``logits_to_keep``):
    the vocabulary projection of the prompt positions is most of a small model's head cost."""
    return {"logits_to_keep": n} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch token lists, padded on the left (decoding appends on the right)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = True
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, uniforms: torch.Tensor,
           *, temperature: float, eos_id: int, pad_id: int,
           between_steps: Callable[[], None] | None = None) -> Decoded:
    """Decode ``uniforms.shape[1]`` tokens per row; all inputs on the model's device. ``between_steps``
    runs before every decoding step (``Workload.check_cancelled``: it raises to stop the decode)."""
    n, steps = uniforms.shape
    device = prompt_ids.device
    out_ids = torch.full((n, steps), pad_id, dtype=torch.long, device=device)
    out_mask = torch.zeros((n, steps), dtype=torch.bool, device=device)
    out_lp = torch.zeros((n, steps), dtype=torch.float32, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    attn = prompt_mask.long()
    pos = positions(prompt_mask)
    cache_kwarg = _cache_kwarg(model)
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True, **_keep_last(model, 1))
    next_pos = pos[:, -1:] + 1
    for t in range(steps):
        if between_steps is not None:
            between_steps()
        logp = torch.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)
        cdf = logp.exp().cumsum(-1)
        target = (uniforms[:, t] * cdf[:, -1]).unsqueeze(-1)
        tok = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        out_ids[:, t] = tok
        out_mask[:, t] = ~done
        out_lp[:, t] = torch.where(done, 0.0, logp.gather(-1, tok[:, None]).squeeze(-1))
        done |= tok == eos_id
        if t == steps - 1 or bool(done.all()):
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                    use_cache=True, **{cache_kwarg: _cache_of(out)})
        next_pos = next_pos + 1
    return Decoded(out_ids, out_mask, out_lp)


def response_logprobs(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      response_ids: torch.Tensor, response_mask: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """Teacher-forced log-probs of the response tokens, [n, T] (differentiable)."""
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    width, steps = prompt_ids.shape[1], response_ids.shape[1]
    keep = _keep_last(model, steps + 1)  # positions width-1 .. the end: each predicts the next token
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask), use_cache=False,
                   **keep).logits
    first = logits.shape[1] - (steps + 1) if keep else width - 1
    logits = logits[:, first: first + steps].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, response_ids[..., None]).squeeze(-1)
