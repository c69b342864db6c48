"""Where each phase instance sits in its GPUs' FIFO queues: the plan's order, unrolled over iterations.

A group's timetable repeats every ``cycle_s``. For a job whose iterations start (rollout) at
``epoch + (k - first) * cycle_s + rollout.start_s``, its train of iteration ``k`` is planned at the
first offset ``train.start_s`` (mod the cycle) at or after that rollout's end, and its sync likewise
after the train. Every GPU orders the phase instances that use it by these planned times; that is
the FIFO order the controller follows. The times only order the queue: a phase starts when its
inputs are ready and its GPUs are free (work-conserving), never waits for its planned time.

Because all GPUs sort by the same planned times, the earliest queued instance is always at the head
of each of its GPUs, so the queues cannot deadlock.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable

from weave_rl.planner.plan import GroupPlan, JobPlan, PhaseSlot, chain_offsets

Key = tuple[str, str, int]  # (job, phase, iteration)
EPS = 1e-9


@dataclass(frozen=True)
class JobSchedule:
    """One job's slots in its group's timetable, anchored at ``epoch_s`` from iteration ``first``."""

    job: str
    group: str
    cycle_s: float
    epoch_s: float
    first: int
    slots: dict[str, PhaseSlot]
    rel: dict[str, float]  # planned start of each phase after the iteration's rollout start

    @classmethod
    def build(cls, group: GroupPlan, job: JobPlan, epoch_s: float = 0.0, first: int = 0) -> JobSchedule:
        slots = {s.phase: s for s in job.phases}
        return cls(job.name, group.name, group.cycle_s, epoch_s, first, slots, chain_offsets(slots, group.cycle_s))

    def planned(self, phase: str, k: int) -> float:
        return self.epoch_s + (k - self.first) * self.cycle_s + self.slots["rollout"].start_s + self.rel[phase]


class GpuQueue:
    """One GPU's FIFO of phase instances: redo entries first (failed iterations), then plan order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str, str, int, JobSchedule]] = []
        self.front: deque[Key] = deque()

    def add(self, schedule: JobSchedule, phase: str, k: int) -> None:
        heapq.heappush(self._heap, (schedule.planned(phase, k), schedule.job, phase, k, schedule))

    def drop_job(self, job: str) -> None:
        self._heap = [e for e in self._heap if e[1] != job]
        heapq.heapify(self._heap)
        self.front = deque(k for k in self.front if k[0] != job)

    def jobs(self) -> set[str]:
        return {e[1] for e in self._heap} | {k[0] for k in self.front}

    def head(self, allowed: Callable[[str, int], bool]) -> Key | None:
        if self.front:
            return self.front[0]
        heap = self._heap
        while heap:
            _, job, phase, k, _ = heap[0]
            if allowed(job, k):
                return (job, phase, k)
            heapq.heappop(heap)  # past the job's last iteration (or drained): the stream ends
        return None

    def after(self, key: Key, allowed: Callable[[str, int], bool]) -> Key | None:
        """The head once ``key`` (the current head) is popped, without popping it."""
        if self.front and self.front[0] == key:
            if len(self.front) > 1:
                return self.front[1]
            return self.head(allowed)
        if self.front or not self._heap:
            return None
        _, job, phase, k, schedule = self._heap[0]
        best = (schedule.planned(phase, k + 1), job, phase, k + 1) if allowed(job, k + 1) else None
        for t, j, p, i, _ in self._heap[1:]:
            if allowed(j, i) and (best is None or (t, j, p, i) < best):
                best = (t, j, p, i)
        return best[1:] if best is not None else None

    def pop(self, key: Key) -> bool:
        """Move past ``key`` if it is the head; the stream's next iteration takes its place."""
        if self.front and self.front[0] == key:
            self.front.popleft()
            return True
        if self.front or not self._heap:
            return False
        _, job, phase, k, schedule = self._heap[0]
        if (job, phase, k) != key:
            return False
        heapq.heapreplace(self._heap, (schedule.planned(phase, k + 1), job, phase, k + 1, schedule))
        return True
