"""Stable response ids, sample streams and merging shards (how prompts split and seeds mix:
``weave_rl.executor.prompt_groups``)."""

from __future__ import annotations

import torch

from weave_rl.executor.workload import Samples

STREAM_PROMPT, STREAM_SAMPLE = 0, 1


def response_id(job: str, iteration: int, shard: int, index: int) -> str:
    """``job/iteration/shard/index``; index is the response's global index in the iteration
    (prompt * group_size + member), so ids are unique across shards whatever the shard count."""
    return f"{job}/{iteration}/{shard}/{index}"


def concat_samples(parts: list[Samples], pad_id: int = 0) -> Samples:
    """Merge shards of one iteration (e.g. for a train worker fed by several rollout workers).

    Prompt columns are re-padded on the left to a common width; the result keeps shard 0/1.
    """
    if not parts:
        raise ValueError("concat_samples needs at least one Samples")
    first = parts[0]
    if any(p.job != first.job or p.iteration != first.iteration for p in parts):
        raise ValueError("concat_samples: parts are from different jobs or iterations")
    width = max(p.data["prompt_ids"].shape[1] for p in parts)
    data: dict[str, torch.Tensor] = {}
    for key in first.data:
        cols = []
        for p in parts:
            t = p.data[key]
            if key in ("prompt_ids", "prompt_mask") and t.shape[1] < width:
                fill = pad_id if key == "prompt_ids" else 0
                t = torch.cat([torch.full((t.shape[0], width - t.shape[1]), fill, dtype=t.dtype), t], dim=1)
            cols.append(t)
        data[key] = torch.cat(cols, dim=0)
    count = sum(p.count for p in parts)
    stats: dict[str, float] = {}
    for key in first.stats:
        if all(key in p.stats for p in parts) and count:
            stats[key] = sum(p.stats[key] * p.count for p in parts) / count  # response-weighted mean
    return Samples(job=first.job, iteration=first.iteration, shard=0, shards=1, data=data, count=count,
                   tokens=sum(p.tokens for p in parts), ids=[i for p in parts for i in p.ids], stats=stats)
