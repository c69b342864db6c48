"""Prompt groups: how an iteration's prompts split into shares, their seeds, and the shape of an
elastic rollout from its groups' durations (one rule for every backend and built-in workload).

``shard_prompts`` gives a share whole prompts (a GRPO group never spans two shares) and ``mix_seed``
derives every seed from integers only, so a share is the same in every process and re-run.

An elastic rollout is split into prompt groups that its GPUs pull one at a time, in order. Given the
groups' compute times, ``pulled_schedule`` replays that pull on ``gpus`` GPUs: the makespan is the
rollout's duration on its planned GPUs alone (what a profile refit should see, whatever GPUs were
lent to it or taken away by migration), and ``tail_share`` is the share of that duration left when
the threshold share of groups is done (what long-tail migration can hand to the next phase). Both
are exact for the pull order, not an estimate of it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence


_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (SplitMix64 finaliser per part; the same in every process)."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = (h ^ (part & _MASK64)) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


def shard_prompts(prompts: int, shard: int, shards: int) -> range:
    """The contiguous prompt indices of share ``shard`` of ``shards``: ``prompts // shards``, one more
    for the first ``prompts % shards`` shares (whole prompts, so whole GRPO groups)."""
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards} is not a valid shard")
    base, extra = divmod(prompts, shards)
    start = shard * base + min(shard, extra)
    return range(start, start + base + (1 if shard < extra else 0))


@dataclass(frozen=True)
class PulledSchedule:
    makespan_s: float
    threshold_s: float  # when ceil(threshold * groups) groups are done
    tail_share: float  # (makespan - threshold_s) / makespan


def pulled_schedule(durations: Sequence[float], gpus: int, threshold: float) -> PulledSchedule:
    """Groups taken in order by whichever of ``gpus`` GPUs is free first."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    free = [0.0] * gpus
    ends = []
    for d in durations:
        t = heapq.heappop(free) + max(0.0, d)
        ends.append(t)
        heapq.heappush(free, t)
    if not ends:
        return PulledSchedule(0.0, 0.0, 0.0)
    ends.sort()
    makespan = ends[-1]
    k = min(len(ends), max(1, math.ceil(threshold * len(ends) - 1e-9)))
    at = ends[k - 1]
    return PulledSchedule(makespan, at, (makespan - at) / makespan if makespan > 0 else 0.0)
