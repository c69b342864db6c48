"""Held-out evaluation of a GRPO job's policy: the mean reward of its greedy answers.

Training rewards are noisy (sampled responses, a different handful of prompts every iteration);
greedy answers to a fixed set of problems are not, so two policies (say the initial one and a
checkpoint's ``policy-K.pt``) compare on equal terms.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from weave_rl.executor.rl.grpo import GRPOWorkload
from weave_rl.executor.rl.model import build_model, initial_params
from weave_rl.executor.rl.rewards import call_reward
from weave_rl.executor.rl.sampling import left_pad
from weave_rl.executor.rl.tasks import Problem


@torch.no_grad()
def greedy_score(job: GRPOWorkload, problems: Sequence[Problem], weights: Mapping[str, torch.Tensor] | None = None,
                 *, batch: int = 32) -> float:
    """Mean of the job's reward over ``problems``, each answered greedily (up to the job's
    ``max_new_tokens``) by the policy with ``weights`` (default: the initial policy), on the CPU."""
    model = build_model(job.opts, job.tokenizer, job.seed)
    weights = dict(weights or initial_params(job.opts, job.tokenizer, job.seed))
    missing = {n for n, _ in model.named_parameters()} - set(weights)
    if missing:
        raise ValueError(f"greedy_score: weights of job {job.job} lack {sorted(missing)[:3]}")
    model.load_state_dict(weights, strict=False)  # named_parameters names: a tied head comes with its embedding
    tok = job.tokenizer
    total = 0.0
    for lo in range(0, len(problems), batch):
        chunk = problems[lo:lo + batch]
        ids, mask = left_pad([job._prompt_tokens(p) for p in chunk], tok.pad_id)
        out = model.generate(input_ids=ids, attention_mask=mask.long(), do_sample=False,
                             max_new_tokens=job.max_new_tokens, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id)
        for i, (p, row) in enumerate(zip(chunk, out[:, ids.shape[1]:]), lo):
            toks = row.tolist()
            if tok.eos_id in toks:
                toks = toks[:toks.index(tok.eos_id)]
            total += call_reward(job.reward_fn, job.opts.reward_name, p.prompt, tok.decode(toks), p.answer,
                                 f"held-out problem {i} of job {job.job}")
    return total / max(1, len(problems))
