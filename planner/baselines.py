"""Baseline planning policies: Solo-D, veRL-style colocation, and Weave's online Algorithm 1.

Each policy is ``plan_<name>(model, **opts) -> Plan`` and returns a plan that ``weave_rl.planner.check``
accepts. They place groups on a live plan (planner/live.py: whole free nodes in id order, so groups
never share a node and plans are reproducible; host memory pinned per node), and:

- ``_Draft`` turns a request for GPUs into fresh nodes, filling the spare GPUs of a node it already
  drafted first (a job whose rollout and train live in one cluster shares a node the way the solo
  reference in ``PlanningModel.solo_placement`` does);
- every group's timetable is the round-robin meta-iteration of ``weave_rl.planner.roundrobin``, and a job is
  placed only where every member of its group still meets its SLO.

A job that cannot be placed is rejected with the reason (SLO below 1, no cluster of an allowed GPU
type, wider than every cluster, state larger than a node's host memory, no free nodes, SLO missed);
the other jobs are still planned.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import inadmissible
from weave_rl.planner.live import LiveGroup, LivePlan, NodeAllocator
from weave_rl.planner.rules import meets_slo
from weave_rl.planner.plan import DEFAULT_ELASTIC, Plan, Rejection, SolverInfo
from weave_rl.planner.roundrobin import Member, RoundRobin, round_robin_timetable
from weave_rl.profiles.jobs import JobSet, JobSpec, PhaseSpec
from weave_rl.topology.spec import ClusterSpec
from weave_rl.topology.topology import Topology, node_of


class Unplaceable(Exception):
    """A job (or one candidate placement of it) cannot be placed; the message is the reason."""


# ----- fresh nodes ----------------------------------------------------------------------------


class _Draft:
    """The fresh nodes one candidate placement would take, GPU by GPU (nothing is taken until the
    placement is chosen)."""

    def __init__(self, alloc: NodeAllocator):
        self.alloc = alloc
        self.nodes: list[str] = []
        self._spare: dict[str, list[str]] = {}  # cluster -> unused GPUs of drafted nodes

    def gpus(self, cluster: ClusterSpec, count: int) -> list[str]:
        spare = self._spare.setdefault(cluster.name, [])
        need = max(0, count - len(spare))
        drafted = sum(1 for n in self.nodes if self.alloc.topology.node(n).cluster == cluster.name)
        fresh = self.alloc.peek(cluster.name, math.ceil(need / cluster.gpus_per_node), skip=drafted)
        if fresh is None:
            raise Unplaceable(f"out of free {cluster.gpu_type} nodes in cluster {cluster.name} "
                              f"({self.alloc.free(cluster.name) - drafted} free)")
        self.nodes += fresh
        spare += [g for n in fresh for g in self.alloc.topology.node(n).gpu_ids]
        taken, self._spare[cluster.name] = spare[:count], spare[count:]
        return taken


def _clusters(topology: Topology, kind: str, phase: PhaseSpec, gpus: int, mem_gb: float,
              types: Sequence[str] | None = None) -> list[ClusterSpec]:
    """Clusters that could host ``gpus`` GPUs of the phase, preferred type first; if none, raise
    with the reason (no such type, too narrow, too little host memory)."""
    types = types if types is not None else _types(phase)
    of_type = [c for t in types for c in topology.clusters.values() if c.gpu_type == t]
    if not of_type:
        raise Unplaceable(f"no cluster of GPU type {'/'.join(types)} for its {kind}")
    wide = [c for c in of_type if c.nodes * c.gpus_per_node >= gpus]
    if not wide:
        largest = max(c.nodes * c.gpus_per_node for c in of_type)
        raise Unplaceable(f"its {kind} needs {gpus} GPUs, wider than every {'/'.join(types)} cluster "
                          f"(largest: {largest})")
    roomy = [c for c in wide if c.host_mem_gb >= mem_gb]
    if not roomy:
        raise Unplaceable(f"its {kind} state needs {mem_gb:g} GB of host memory per node, more than a "
                          f"{'/'.join(types)} node has ({max(c.host_mem_gb for c in wide):g} GB)")
    return roomy


def _types(phase: PhaseSpec) -> list[str]:
    return [phase.gpu_type, *[t for t in phase.gpu_types if t != phase.gpu_type]]


def _ref_gpus(phase: PhaseSpec) -> int:
    """The phase's reference GPU count, or the nearest of its ``gpu_options`` if it is not one."""
    return min(phase.gpu_options, key=lambda g: (abs(g - phase.gpus), g))


def _draft_phase(draft: _Draft, clusters: list[ClusterSpec], count: int) -> list[str]:
    """GPUs for one phase from the first of ``clusters`` with enough free nodes."""
    reason = None
    for cluster in clusters:
        try:
            return draft.gpus(cluster, count)
        except Unplaceable as exc:
            reason = reason or exc
    raise reason  # type: ignore[misc]


# ----- groups and the shared bookkeeping ----------------------------------------------------------


class _Book(LivePlan):
    """A live plan with what every policy asks of it while it plans."""

    def __init__(self, model: PlanningModel):
        super().__init__(model)
        self._train_busy: dict[tuple[str, tuple[str, ...]], float] = {}

    def train_busy(self, job: JobSpec, gpus: tuple[str, ...]) -> float:
        """Seconds ``job``'s train and its warm switch hold the training GPUs ``gpus`` per cycle."""
        key = (job.name, gpus)
        if key not in self._train_busy:
            gpu_type = self.topology.gpu_type_of(gpus[0])
            self._train_busy[key] = (self.model.duration(job, "train", len(gpus), gpu_type)
                                     + self.model.max_switch_s(job, "train", list(gpus)))
        return self._train_busy[key]

    def timetable(self, members: list[Member]) -> RoundRobin:
        """The round-robin timetable, or ``Unplaceable`` naming a member whose SLO it misses."""
        rr = round_robin_timetable(self.model, members)
        for m in members:
            solo = self.model.solo_of(m.job)
            if not meets_slo(rr.cycle_s, m.job.slo * solo):
                raise Unplaceable(f"iteration {rr.cycle_s:.1f} s would exceed {m.job.name}'s SLO "
                                  f"({m.job.slo:g} x solo {solo:.1f} s = {m.job.slo * solo:.1f} s)")
        return rr

    def fits(self, member: Member) -> None:
        """``Unplaceable`` when the member's state would overflow a node's host memory."""
        reason = self.memory.overflow(member)
        if reason is not None:
            raise Unplaceable(reason)


def _admissible(book: _Book, job: JobSpec) -> None:
    """``Unplaceable`` when no plan can place the job, whatever is placed already."""
    reason = inadmissible(book.model, job)
    if reason is not None:
        raise Unplaceable(reason)


def _fresh_member(book: _Book, job: JobSpec) -> tuple[_Draft, Member]:
    """The job alone at its reference GPU counts on fresh nodes of its preferred types."""
    draft = _Draft(book.alloc)
    gpus = {}
    for kind in ("rollout", "train"):
        phase = job.phase(kind)
        count = _ref_gpus(phase)
        gpus[kind] = _draft_phase(draft, _clusters(book.topology, kind, phase, count, phase.host_mem_gb), count)
    member = Member(job, tuple(gpus["rollout"]), tuple(gpus["train"]))
    book.fits(member)
    return draft, member


def _plan_each(model: PlanningModel, place: Callable[[_Book, JobSpec], None]) -> _Book:
    book = _Book(model)
    for job in sorted(model.jobs.jobs, key=lambda j: j.arrival_s):  # stable: file order breaks ties
        try:
            _admissible(book, job)
            place(book, job)
        except Unplaceable as exc:
            book.rejected.append(Rejection(name=job.name, reason=str(exc)))
    return book


# ----- Solo-D -------------------------------------------------------------------------------------


def plan_solo(model: PlanningModel) -> Plan:
    """Solo-D: every job alone on dedicated rollout and train nodes (the cost every bubble costs)."""
    started = time.perf_counter()

    def place(book: _Book, job: JobSpec) -> None:
        draft, member = _fresh_member(book, job)
        book.open(member, draft.nodes, *book.timetable([member]))

    return _assemble("solo", "FEASIBLE", _plan_each(model, place), started)


# ----- veRL-style colocation --------------------------------------------------------------------


def plan_colocate(model: PlanningModel) -> Plan:
    """veRL-style: each job alone, rollout and train taking turns on the same training GPUs.

    The rollout runs on the job's training type (the plan contract's one exception to a phase's
    ``gpu_types``), slowed by the type rule; the GPU count is the smallest of the training
    ``gpu_options`` that meets the SLO with both warm switches on every cycle.
    """
    started = time.perf_counter()

    def place(book: _Book, job: JobSpec) -> None:
        types = [t for t in _types(job.train) if t == job.train.gpu_type or t in job.rollout.gpu_types]
        reason = None
        for count in sorted(job.train.gpu_options):
            try:
                _colocate_at(book, job, count, types)
                return
            except Unplaceable as exc:
                reason = reason or exc
        raise reason  # type: ignore[misc]

    return _assemble("colocate", "FEASIBLE", _plan_each(model, place), started)


def _colocate_at(book: _Book, job: JobSpec, count: int, types: list[str]) -> None:
    mem = job.rollout.host_mem_gb + job.train.host_mem_gb
    clusters = _clusters(book.topology, "train", job.train, count, mem, types)
    draft = _Draft(book.alloc)
    gpus = tuple(_draft_phase(draft, clusters, count))
    member = Member(job, gpus, gpus)
    book.fits(member)
    book.open(member, draft.nodes, *book.timetable([member]))


# ----- Weave, Algorithm 1 -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    """One way to admit a job: into group number ``group`` (a new one for ISOLATED) on ``member``'s
    GPUs, adding ``draft``'s nodes at ``delta`` $/h."""

    delta: float
    rank: int  # 0 direct packing, 1 rollout scaling, 2 isolated group (the tie-break order)
    group: int
    member: Member
    draft: _Draft
    timetable: RoundRobin

    @property
    def key(self) -> tuple:
        return (round(self.delta, 9), self.rank, self.group)


DIRECT, SCALE, ISOLATED = 0, 1, 2


def plan_weave(model: PlanningModel, max_group_size: int = 5) -> Plan:
    """Weave's online admission (paper Algorithm 1): each arriving job goes where it adds the least
    cost: into a bubble of an existing group (direct packing, free), onto fresh rollout nodes added
    to a group (rollout scaling), or into a new isolated group. Existing jobs never move."""
    if max_group_size < 1:
        raise ValueError(f"max_group_size must be >= 1, got {max_group_size}")
    started = time.perf_counter()
    book = _plan_each(model, lambda book, job: _weave_place(book, job, max_group_size))
    return _assemble("weave", "HEURISTIC", book, started)


def _weave_place(book: _Book, job: JobSpec, max_group_size: int) -> LiveGroup:
    """Admit ``job`` at its least-cost candidate; the group it joined (or opened)."""
    best: _Candidate | None = None
    reason: Unplaceable | None = None
    for candidate in _weave_candidates(book, job, max_group_size):
        if isinstance(candidate, Unplaceable):
            reason = candidate  # the last one is the isolated group's: the root cause
        elif best is None or candidate.key < best.key:
            best = candidate
    if best is None:
        raise reason or Unplaceable("no placement found")
    return _admit(book, best)


class OnlineWeave:
    """Algorithm 1 as the paper runs it, one event at a time: an arrival is admitted around the
    groups in force (direct packing, rollout scaling or an isolated group) and nothing already
    placed moves; a departure leaves its group, whose other members keep their nodes. Nodes no
    member uses any more (an emptied group, a leaver's own scaled rollout nodes) are freed."""

    def __init__(self, topology: Topology, quantile: float | str = 0.95, max_group_size: int = 5):
        if max_group_size < 1:
            raise ValueError(f"max_group_size must be >= 1, got {max_group_size}")
        self.book = _Book(PlanningModel(topology, JobSet(), quantile))
        self.max_group_size = max_group_size

    @classmethod
    def in_force(cls, topology: Topology, plan: Plan, specs: dict[str, JobSpec], quantile: float | str = 0.95,
                 max_group_size: int = 5) -> "OnlineWeave":
        """Admission around a plan already in force (e.g. after a re-plan): its groups, their nodes
        taken, their members' memory pinned."""
        online = cls(topology, quantile, max_group_size)
        online.book.load(plan, specs)
        online.book.rejected = []
        return online

    def admit(self, job: JobSpec) -> str:
        """The name of the group ``job`` joined; ``Unplaceable`` (the reason) if it fits nowhere."""
        _admissible(self.book, job)
        return _weave_place(self.book, job, self.max_group_size).name

    def release(self, name: str) -> None:
        if self.book.group_of(name) is not None:
            self.book.release(name)

    def plan(self) -> Plan:
        return _assemble("weave", "HEURISTIC", self.book, time.perf_counter())


def _weave_candidates(book: _Book, job: JobSpec, max_group_size: int):
    """Every candidate placement (or the ``Unplaceable`` that ruled one out), isolated group last."""
    for index, group in enumerate(book.groups.values()):
        full = len(group.members) >= max_group_size
        if full or not _fits_train(book.topology, job, group) or not _train_may_fit(book, job, group) \
                or _saturated(book.model, group):
            continue
        for rank, member, draft in _group_placements(book, job, group):
            try:
                book.fits(member)
                rr = book.timetable([*group.members, member])
            except Unplaceable as exc:
                yield exc
                continue
            yield _Candidate(book.topology.cost_usd_per_hour(draft.nodes), rank, index, member, draft, rr)
    try:
        draft, member = _fresh_member(book, job)
        yield _Candidate(book.topology.cost_usd_per_hour(draft.nodes), ISOLATED, len(book.groups), member, draft,
                         book.timetable([member]))
    except Unplaceable as exc:
        yield exc


def _saturated(model: PlanningModel, group: LiveGroup) -> bool:
    """Weave's pruning rule: T_load = max(sum of trains, busiest rollout node) >= T_cycle = max solo."""
    roll, train = {}, {}
    for m in group.members:
        for kind, table in (("rollout", roll), ("train", train)):
            gpus = m.gpus(kind)
            table[m.job.name] = model.duration(m.job, kind, len(gpus), model.topology.gpu_type_of(gpus[0]))
    per_node: dict[str, float] = {}
    for m in group.members:
        for node in {node_of(g) for g in m.rollout_gpus}:
            per_node[node] = per_node.get(node, 0.0) + roll[m.job.name]
    load = max(sum(train.values()), max(per_node.values()))
    cycle = max(roll[n] + train[n] for n in roll)
    return load >= cycle


def _train_may_fit(book: _Book, job: JobSpec, group: LiveGroup) -> bool:
    """Necessary for any round-robin timetable within every SLO: the shared training GPUs run every
    member's train and warm switch once per cycle. Skipping groups that fail it changes no decision;
    it only saves the timetable simulation (admission must stay fast with thousands of jobs)."""
    members = [m.job for m in group.members] + [job]
    busy = sum(book.train_busy(j, group.train_gpus) for j in members)
    return meets_slo(busy, min(j.slo * book.model.solo_of(j) for j in members))


def _fits_train(topology: Topology, job: JobSpec, group: LiveGroup) -> bool:
    """The group's training pool is fixed (no re-parallelization): same GPU count and type."""
    gpus = group.train_gpus
    return len(gpus) in job.train.gpu_options and topology.gpu_type_of(gpus[0]) in job.train.gpu_types


def _group_placements(book: _Book, job: JobSpec, group: LiveGroup):
    """(rank, member, draft) for direct packing on every run of the group's rollout nodes that fits
    the rollout, then for rollout scaling onto fresh nodes."""
    topo = book.topology
    phase = job.rollout
    count = _ref_gpus(phase)
    for run in _runs(topo, group.rollout_nodes, phase, count):
        gpus = [g for n in run for g in topo.node(n).gpu_ids][:count]
        yield DIRECT, Member(job, tuple(gpus), group.train_gpus), _Draft(book.alloc)
    draft = _Draft(book.alloc)
    try:
        gpus = _draft_phase(draft, _clusters(topo, "rollout", phase, count, phase.host_mem_gb), count)
    except Unplaceable:
        return  # no fresh rollout nodes: direct packing or an isolated group may still do
    yield SCALE, Member(job, tuple(gpus), group.train_gpus), draft


def _runs(topology: Topology, nodes: list[str], phase: PhaseSpec, count: int) -> list[list[str]]:
    """Every run of consecutive ``nodes`` (one cluster of an allowed type) just wide enough for
    ``count`` GPUs."""
    out = []
    for i in range(len(nodes)):
        run, gpus = [], 0
        for node_id in nodes[i:]:
            node = topology.node(node_id)
            if node.gpu_type not in phase.gpu_types or (run and node.cluster != topology.node(run[0]).cluster):
                break
            run.append(node_id)
            gpus += node.gpus
            if gpus >= count:
                out.append(run)
                break
    return out


def _admit(book: _Book, candidate: _Candidate) -> LiveGroup:
    if candidate.rank == ISOLATED:
        return book.open(candidate.member, candidate.draft.nodes, *candidate.timetable)
    group = list(book.groups.values())[candidate.group]
    book.join(group, candidate.member, candidate.draft.nodes, *candidate.timetable)
    return group


# ----- the Plan ---------------------------------------------------------------------------------


def _assemble(policy: str, status: str, book: _Book, started: float) -> Plan:
    groups = book.group_plans()
    cost = sum(g.usd_per_hour or 0.0 for g in groups)
    return Plan(policy=policy, quantile=_plan_quantile(book.model.quantile), topology=book.topology.name,
                cost_usd_per_hour=cost, groups=groups, rejected=book.rejected, elastic=dict(DEFAULT_ELASTIC),
                solver=SolverInfo(name=policy, status=status, wall_s=time.perf_counter() - started, objective=cost))


def _plan_quantile(q: float | str) -> float | str:
    return float(q) if isinstance(q, str) and q != "max" else q


__all__ = ["OnlineWeave", "Unplaceable", "plan_colocate", "plan_solo", "plan_weave"]
