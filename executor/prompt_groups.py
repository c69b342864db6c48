"""The shape of an elastic rollout from its prompt groups' durations (one rule for every backend).

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
