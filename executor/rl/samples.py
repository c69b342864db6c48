"""How an iteration's prompts split into shards, stable ids and seeds, and merging shards."""

from __future__ import annotations

import torch

from weave_rl.executor.workload import Samples

_MASK64 = (1 << 64) - 1
STREAM_PROMPT, STREAM_SAMPLE = 0, 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (SplitMix64 finaliser per part; same in every process)."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = (h ^ (part & _MASK64)) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


def shard_prompts(prompts: int, shard: int, shards: int) -> range:
    """Contiguous slice of the iteration's prompt indices; whole GRPO groups stay in one shard."""
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards} is not a valid shard")
    base, extra = divmod(prompts, shards)
    start = shard * base + min(shard, extra)
    return range(start, start + base + (1 if shard < extra else 0))


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
