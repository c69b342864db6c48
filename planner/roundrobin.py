"""Weave's intra-group schedule (paper section 4.3): one round-robin meta-iteration, made periodic.

Every member runs its rollout and its train exactly once per cycle, in member (arrival) order:

1. List-schedule one meta-iteration. A rollout starts when all its GPUs are free; a train when its
   rollout is done and its GPUs are free; the sync follows the train at once. On a GPU that hosts two
   or more distinct (job, role) phases, a phase also waits for its warm-switch time after the GPU
   frees up (the switch may overlap the job's own previous phase on other GPUs, e.g. the train state
   loads while the rollout runs).
2. Pick the smallest cycle ``C`` that lets this pattern repeat (see ``planner/plan.py``):
   - per GPU, its phases from the first one's switch-extended start to the last one's end fit in C;
   - per job, its next rollout (``k`` cycles later, ``k <= 1 + max_staleness``) starts after its
     sync ends: ``C >= (sync end - rollout start) / (1 + max_staleness)``, and C covers each phase.
   The same pattern with every rollout started as late as its train and its GPUs allow (finishing
   just in time) often needs a shorter C; the shorter of the two is kept.
3. Take every start modulo C.

Durations, switch and sync times are rounded up to whole milliseconds, the resolution of every
timetable (as ``PlanningModel.solo_iteration_s`` does), so a job alone gets exactly its solo time.

For an unsaturated group this gives Theorem 1's cycle, the longest member's solo iteration, plus
any switch time that cannot hide in a bubble. No solver: it is the constant-cost "simulation of one
meta-iteration" that Algorithm 1's SLO check runs for every candidate placement.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, NamedTuple, Sequence

from weave_rl.planner.model import PlanningModel, ceil_ms
from weave_rl.profiles.jobs import JobSpec

if TYPE_CHECKING:
    from weave_rl.planner.plan import GroupPlan

GPU_PHASES = ("rollout", "train")


@dataclass(frozen=True)
class Member:
    """One job of a group with the GPUs of its rollout and train phases."""

    job: JobSpec
    rollout_gpus: tuple[str, ...]
    train_gpus: tuple[str, ...]

    def gpus(self, kind: str) -> tuple[str, ...]:
        return self.rollout_gpus if kind in ("rollout", "sync") else self.train_gpus


class PhaseTime(NamedTuple):
    """A phase in the timetable: offset in ``[0, cycle)`` and length (unpacks as a tuple)."""

    start_s: float
    duration_s: float


@dataclass(frozen=True)
class RoundRobin:
    """A group's periodic timetable: ``phases[job][phase]`` for phase in rollout, train, sync."""

    cycle_s: float
    phases: dict[str, dict[str, PhaseTime]]

    def __iter__(self):  # allows ``cycle, phases = round_robin_timetable(...)``
        return iter((self.cycle_s, self.phases))


MemberLike = Member | tuple[JobSpec, Sequence[str], Sequence[str]]


def as_member(item: MemberLike) -> Member:
    if isinstance(item, Member):
        return item
    job, rollout_gpus, train_gpus = item
    return Member(job, tuple(rollout_gpus), tuple(train_gpus))


def round_robin_timetable(model: PlanningModel, members: Iterable[MemberLike]) -> RoundRobin:
    """The round-robin timetable of ``members`` (in order) on their GPUs; see the module docstring."""
    members = [as_member(m) for m in members]
    if not members:
        raise ValueError("a round-robin timetable needs at least one member")
    line = _MetaIteration(model, {gpu for gpu, roles in gpu_users(members).items() if len(roles) >= 2})
    for m in members:
        line.add(m)
    best = min((line, line.justified()), key=_MetaIteration.cycle)
    cycle = best.cycle()
    return RoundRobin(cycle, {name: {k: PhaseTime(_offset(p.start_s, cycle), p.duration_s) for k, p in ph.items()}
                              for name, ph in best.times.items()})


def gpu_users(members: Iterable[Member]) -> dict[str, set[tuple[str, str]]]:
    """Per GPU, the (job, role) phases that run on it: where two or more do, each pays its warm switch."""
    users: dict[str, set[tuple[str, str]]] = {}
    for m in members:
        for kind in GPU_PHASES:
            for gpu in m.gpus(kind):
                users.setdefault(gpu, set()).add((m.job.name, kind))
    return users


class _MetaIteration:
    """One meta-iteration on the line (absolute times from 0): phase times and, per GPU, the phases
    it runs in order."""

    def __init__(self, model: PlanningModel, shared: set[str]):
        self.model = model
        self.shared = shared
        self.members: list[Member] = []
        self.times: dict[str, dict[str, PhaseTime]] = {}
        self.switch: dict[tuple[str, str], float] = {}  # (job, kind) -> warm switch paid on shared GPUs
        self.queue: dict[str, list[tuple[str, str]]] = {}  # GPU -> (job, kind) in run order

    def add(self, m: Member) -> None:
        name = m.job.name
        self.members.append(m)
        self.times[name] = {}
        rollout = self._place(m, "rollout", ready=0.0)
        train = self._place(m, "train", ready=rollout.start_s + rollout.duration_s)
        sync_s = ceil_ms(self.model.sync_s(m.job, list(m.train_gpus), list(m.rollout_gpus)))
        self.times[name]["sync"] = PhaseTime(train.start_s + train.duration_s, sync_s)

    def _place(self, m: Member, kind: str, ready: float) -> PhaseTime:
        gpus = m.gpus(kind)
        duration = ceil_ms(self.model.duration(m.job, kind, len(gpus), self.model.topology.gpu_type_of(gpus[0])))
        key = (m.job.name, kind)
        shared = self.shared.intersection(gpus)
        self.switch[key] = ceil_ms(self.model.max_switch_s(m.job, kind, list(gpus))) if shared else 0.0
        start = max(ready, *(self._free(g) + self.gap(g, key) for g in gpus))
        for g in gpus:
            self.queue.setdefault(g, []).append(key)
        self.times[m.job.name][kind] = slot = PhaseTime(start, duration)
        return slot

    def _free(self, gpu: str) -> float:
        if not self.queue.get(gpu):
            return 0.0
        job, kind = self.queue[gpu][-1]
        return _end(self.times[job][kind])

    def gap(self, gpu: str, key: tuple[str, str]) -> float:
        return self.switch[key] if gpu in self.shared else 0.0

    def justified(self) -> _MetaIteration:
        """A copy whose rollouts start as late as their train and their GPUs' next phases allow.

        A rollout that finishes just in time for its train keeps the job's own loop (rollout ->
        train -> sync -> next rollout) short, so a later member that waited for the shared training
        GPUs need not stretch the cycle; the order on every GPU stays the same.
        """
        out = copy.copy(self)
        out.times = {name: dict(ph) for name, ph in self.times.items()}
        for m in reversed(self.members):
            name = m.job.name
            rollout, train = out.times[name]["rollout"], out.times[name]["train"]
            latest = train.start_s
            for g in m.rollout_gpus:
                nxt = out._next(g, (name, "rollout"))
                if nxt is not None:
                    latest = min(latest, out.times[nxt[0]][nxt[1]].start_s - out.gap(g, nxt))
            start = max(rollout.start_s, latest - rollout.duration_s)
            out.times[name]["rollout"] = PhaseTime(start, rollout.duration_s)
        return out

    def _next(self, gpu: str, key: tuple[str, str]) -> tuple[str, str] | None:
        queue = self.queue[gpu]
        i = queue.index(key)
        return queue[i + 1] if i + 1 < len(queue) else None

    def cycle(self) -> float:
        """The smallest period for this pattern: every GPU's busy stretch (switch gaps included) and
        every job's own loop fit in it."""
        spans = []
        for g, queue in self.queue.items():
            first, last = queue[0], queue[-1]
            spans.append(_end(self.times[last[0]][last[1]]) - (self.times[first[0]][first[1]].start_s
                                                               - self.gap(g, first)))
        return max(*spans, *(_job_bound(m.job, self.times[m.job.name]) for m in self.members))


def _end(p: PhaseTime) -> float:
    return p.start_s + p.duration_s


def _job_bound(job: JobSpec, times: dict[str, PhaseTime]) -> float:
    """Smallest cycle that lets the job's next rollout (``1 + max_staleness`` cycles on at most)
    start after its sync, and holds each of its phases."""
    rollout, sync = times["rollout"], times["sync"]
    loop = sync.start_s + sync.duration_s - rollout.start_s
    return max(loop / (1 + job.max_staleness), *(p.duration_s for p in times.values()))


def _offset(start: float, cycle: float) -> float:
    """``start`` modulo the cycle, in ``[0, cycle)`` even after round-off."""
    offset = start % cycle
    return 0.0 if offset >= cycle * (1 - 1e-12) else offset


def group_plan(topology, name: str, members: Sequence[Member], phases: dict[str, dict[str, PhaseTime]],
               cycle_s: float, nodes: Sequence[str], solo_of) -> "GroupPlan":
    """The plan of one group: each member's rollout, train and sync at their times in the cycle."""
    from weave_rl.planner.plan import GroupPlan, JobPlan, PhaseSlot

    jobs = []
    for m in members:
        times = phases[m.job.name]
        slots = [PhaseSlot(phase=kind, start_s=times[kind].start_s, duration_s=times[kind].duration_s,
                           gpus=list(m.gpus(kind)), gpu_type=topology.gpu_type_of(m.gpus(kind)[0]))
                 for kind in ("rollout", "train", "sync")]
        jobs.append(JobPlan(name=m.job.name, solo_iteration_s=solo_of(m.job), iteration_s=cycle_s, slo=m.job.slo,
                            phases=slots))
    return GroupPlan(name=name, cycle_s=cycle_s, nodes=list(nodes), jobs=jobs,
                     usd_per_hour=round(topology.cost_usd_per_hour(nodes), 6))


__all__ = ["Member", "PhaseTime", "RoundRobin", "as_member", "gpu_users", "group_plan", "round_robin_timetable"]
