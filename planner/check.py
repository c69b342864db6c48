"""The independent plan checker (DESIGN 3.3): is a plan valid for this topology and these jobs?

It re-derives everything from the plan, the topology and the jobs file with the shared
``PlanningModel`` (durations, warm-switch, sync and solo times) and never imports a solver module
(``weave_rl.planner.optimal``, ``weave_rl.planner.timetable``, ``weave_rl.planner.baselines``, ``weave_rl.planner.weave``), so a planner
bug cannot hide behind itself. ``check_plan`` lists every violation, one rule name each:

==============  ==================================================================================
``placement``   every job of the jobs file is in exactly one group or in ``rejected`` (once); no
                unknown job; every rejection has a reason
``nodes``       node lists of groups are disjoint and exist; every GPU id exists, lies on a node of
                its group and appears once in its phase
``phases``      one rollout, train and sync per job; a rollout/train phase has one GPU type, in its
                ``gpu_types``, a GPU count in its ``gpu_options``, ``start_s`` in ``[0, cycle_s)``
                and lasts at most ``cycle_s``
``duration``    each rollout/train lasts at least its modelled duration at the plan's quantile; a sync
                at least the two-stage sync time; the sync targets are the job's rollout GPUs
``overlap``     per GPU, rollout/train intervals (modulo the cycle) are disjoint; where a GPU hosts
                two or more (job, role) phases, each is preceded by its warm-switch time, and those
                extended intervals are disjoint too
``chain``       rollout -> train -> sync -> next rollout, walking the circle, spans ``k`` cycles with
                ``1 <= k <= 1 + max_staleness``
``iteration``   ``iteration_s == cycle_s``; ``solo_iteration_s`` is the model's; the SLO holds
``memory``      per node, the host memory of the (job, phase)s pinned there fits
``cost``        ``cost_usd_per_hour`` (and each group's ``usd_per_hour``) is the price of the nodes
                held; the lower bound does not exceed it
``topology``    the plan names this topology
==============  ==================================================================================

Tolerances: ``tol`` is absolute seconds for times on the circle (overlap, chain, start offsets) and
relative for durations, the solo time, iteration time, and costs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from weave_rl.core.errors import InputError
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.plan import GroupPlan, JobPlan, PhaseSlot, Plan, circular_gap
from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import Topology, node_of

RULES = ("placement", "nodes", "phases", "duration", "overlap", "chain", "iteration", "memory", "cost",
         "topology")
GPU_PHASES = ("rollout", "train")


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.where}: {self.message}"


def format_violations(violations: Iterable[Violation]) -> str:
    return "\n".join(str(v) for v in violations)


def assert_valid(plan: Plan, topology: Topology, jobs: JobSet, *, tol: float = 1e-6) -> None:
    violations = check_plan(plan, topology, jobs, tol=tol)
    if violations:
        raise AssertionError(f"{len(violations)} plan violation(s):\n{format_violations(violations)}")


def check_plan(plan: Plan, topology: Topology, jobs: JobSet, *, tol: float = 1e-6) -> list[Violation]:
    return _Checker(plan, topology, jobs, tol).run()


def require_valid(plan: Plan, topology: Topology, jobs: JobSet, plan_file: str) -> None:
    """``InputError`` listing every violation of a plan about to be executed (``--no-check`` skips it)."""
    violations = check_plan(plan, topology, jobs)
    if violations:
        raise InputError(plan_file, "groups", f"the plan fails the checker ({len(violations)} violation"
                         f"{'s' if len(violations) > 1 else ''}; --no-check runs it anyway):\n"
                         + format_violations(violations))


# ----- helpers -------------------------------------------------------------------------------------


def _where(group: GroupPlan, job: JobPlan | None = None, phase: str | None = None) -> str:
    parts = [f"group {group.name}"]
    if job is not None:
        parts.append(f"job {job.name}")
    if phase is not None:
        parts.append(phase)
    return " / ".join(parts)


def _close(a: float, b: float, tol: float) -> bool:
    """Equal within relative ``tol`` (absolute ``tol`` near zero)."""
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _gpu_list(gpus: Iterable[str], limit: int = 4) -> str:
    gpus = sorted(gpus)
    shown = ", ".join(gpus[:limit])
    return shown + (f", ... ({len(gpus)} in all)" if len(gpus) > limit else "")


def circular_segments(start: float, length: float, cycle: float, tol: float = 1e-6) -> list[tuple[float, float]]:
    """``[start, start + length)`` on a circle of circumference ``cycle`` as 1 or 2 plain segments.

    An interval that runs past the end of the cycle wraps: ``[s, C)`` and ``[0, s + length - C)``.
    One at least a whole cycle long covers the circle.
    """
    if length <= 0:
        return []
    if length >= cycle - tol:
        return [(0.0, cycle)]
    s = start % cycle
    if s > cycle - tol:  # round-off just below a whole cycle
        s = 0.0
    e = s + length
    if e <= cycle + tol:
        return [(s, min(e, cycle))]
    return [(s, cycle), (0.0, e - cycle)]


def circular_overlap(a: tuple[float, float], b: tuple[float, float], cycle: float, tol: float = 1e-6) -> float:
    """Length of the overlap of two intervals ``(start, length)`` taken modulo ``cycle`` (0 if none)."""
    total = 0.0
    for a0, a1 in circular_segments(*a, cycle, tol):
        for b0, b1 in circular_segments(*b, cycle, tol):
            total += max(0.0, min(a1, b1) - max(a0, b0))
    return total


@dataclass(frozen=True)
class _Slot:
    key: tuple[int, int]  # (job index, phase index) inside the group
    group: GroupPlan
    job: JobPlan
    spec: JobSpec | None
    slot: PhaseSlot


# ----- the checker ---------------------------------------------------------------------------------


class _Checker:
    def __init__(self, plan: Plan, topology: Topology, jobs: JobSet, tol: float):
        self.plan = plan
        self.topology = topology
        self.jobs = jobs
        self.tol = tol
        self.specs = {job.name: job for job in jobs.jobs}
        self.model = PlanningModel(topology, jobs, plan.quantile)
        self.out: list[Violation] = []

    def add(self, rule: str, where: str, message: str) -> None:
        self.out.append(Violation(rule, where, message))

    def run(self) -> list[Violation]:
        self.check_topology()
        self.check_placement()
        self.check_nodes()
        for group in self.plan.groups:
            for job in group.jobs:
                self.check_job(group, job)
            self.check_overlap(group)
        self.check_memory()
        self.check_cost()
        return self.out

    # ----- small queries -------------------------------------------------------------------------
    def gpu_known(self, gpu: str) -> bool:
        try:
            node = node_of(gpu)
        except ValueError:
            return False
        return node in self.topology.nodes and int(gpu.rpartition(":")[2]) < self.topology.nodes[node].gpus

    def all_known(self, gpus: Iterable[str]) -> bool:
        return all(self.gpu_known(g) for g in gpus)

    def slot_type(self, slot: PhaseSlot) -> str | None:
        """The one GPU type of a phase's GPUs, or None when unknown GPUs or mixed types."""
        if not self.all_known(slot.gpus):
            return None
        types = {self.topology.gpu_type_of(g) for g in slot.gpus}
        return types.pop() if len(types) == 1 else None

    # ----- topology ------------------------------------------------------------------------------
    def check_topology(self) -> None:
        if self.plan.topology != self.topology.name:
            self.add("topology", "plan",
                     f"plan is for topology {self.plan.topology!r}, checked against {self.topology.name!r}")

    # ----- placement -----------------------------------------------------------------------------
    def check_placement(self) -> None:
        placed: dict[str, list[str]] = defaultdict(list)
        for group in self.plan.groups:
            for job in group.jobs:
                placed[job.name].append(f"group {group.name}")
        rejected: dict[str, int] = defaultdict(int)
        for rej in self.plan.rejected:
            rejected[rej.name] += 1
            if not rej.reason.strip():
                self.add("placement", f"rejected {rej.name}", "rejection has no reason")
        for name in self.jobs.names:
            where = f"job {name}"
            groups, times_rejected = placed.get(name, []), rejected.get(name, 0)
            if not groups and not times_rejected:
                self.add("placement", where, "job of the jobs file is neither placed nor rejected")
            if len(groups) > 1:
                self.add("placement", where, f"placed {len(groups)} times ({', '.join(groups)})")
            if groups and times_rejected:
                self.add("placement", where, f"both placed ({', '.join(groups)}) and rejected")
            if times_rejected > 1:
                self.add("placement", where, f"rejected {times_rejected} times")
        for name in sorted(set(placed) | set(rejected)):
            if name not in self.specs:
                self.add("placement", f"job {name}", "job is not in the jobs file")

    # ----- nodes ---------------------------------------------------------------------------------
    def check_nodes(self) -> None:
        owner: dict[str, str] = {}
        for group in self.plan.groups:
            seen: set[str] = set()
            for node in group.nodes:
                if node in seen:
                    self.add("nodes", f"group {group.name}", f"node {node} listed twice")
                    continue
                seen.add(node)
                if node not in self.topology.nodes:
                    self.add("nodes", f"node {node}", f"group {group.name}: no such node in topology "
                                                      f"{self.topology.name!r}")
                if node in owner:
                    self.add("nodes", f"node {node}", f"in two groups ({owner[node]} and {group.name})")
                else:
                    owner[node] = group.name
            for job in group.jobs:
                for slot in job.phases:
                    self.check_slot_gpus(group, job, slot, seen)

    def check_slot_gpus(self, group: GroupPlan, job: JobPlan, slot: PhaseSlot, group_nodes: set[str]) -> None:
        where = _where(group, job, slot.phase)
        dups = sorted({g for g in slot.gpus if slot.gpus.count(g) > 1})
        if dups:
            self.add("nodes", where, f"GPUs listed more than once: {_gpu_list(dups)}")
        unknown, outside = [], []
        for gpu in dict.fromkeys(slot.gpus):
            if not self.gpu_known(gpu):
                unknown.append(gpu)
            elif node_of(gpu) not in group_nodes:
                outside.append(gpu)
        if unknown:
            self.add("nodes", where, f"GPUs not in topology {self.topology.name!r}: {_gpu_list(unknown)}")
        if outside:
            nodes = sorted({node_of(g) for g in outside})
            self.add("nodes", where, f"GPUs on nodes outside the group ({', '.join(nodes)}): {_gpu_list(outside)}")

    # ----- one job: phases, duration, chain, iteration ------------------------------------------------
    def check_job(self, group: GroupPlan, job: JobPlan) -> None:
        spec = self.specs.get(job.name)
        by_kind: dict[str, list[PhaseSlot]] = defaultdict(list)
        for slot in job.phases:
            by_kind[slot.phase].append(slot)
        for kind in ("rollout", "train", "sync"):
            if len(by_kind[kind]) != 1:
                self.add("phases", _where(group, job), f"has {len(by_kind[kind])} {kind} phases, expected 1")
        cycle = group.cycle_s
        # Rollout and train taking turns on the same GPUs (DESIGN 3.3's colocated member).
        colocated = len(by_kind["rollout"]) == len(by_kind["train"]) == 1 \
            and sorted(by_kind["rollout"][0].gpus) == sorted(by_kind["train"][0].gpus)
        for slot in job.phases:
            where = _where(group, job, slot.phase)
            if not (-self.tol <= slot.start_s < cycle - self.tol):
                self.add("phases", where, f"start_s {_fmt(slot.start_s)} is outside [0, cycle_s={_fmt(cycle)})")
            if slot.phase in GPU_PHASES and slot.duration_s > cycle + self.tol:
                self.add("phases", where, f"duration_s {_fmt(slot.duration_s)} exceeds cycle_s {_fmt(cycle)}")
            if slot.phase in GPU_PHASES and spec is not None:
                self.check_slot_phase(where, spec, slot, colocated)
        if spec is None:
            return
        one = {k: v[0] for k, v in by_kind.items() if len(v) == 1}
        self.check_duration(group, job, spec, one)
        if len(one) == 3:
            self.check_chain(group, job, spec, one["rollout"], one["train"], one["sync"])
        self.check_iteration(group, job, spec)

    def check_slot_phase(self, where: str, spec: JobSpec, slot: PhaseSlot, colocated: bool = False) -> None:
        phase = spec.phase(slot.phase)
        allowed_types, allowed_counts = tuple(phase.gpu_types), tuple(phase.gpu_options)
        if (self.plan.policy == "colocate" or colocated) and slot.phase == "rollout":
            # A colocated rollout (the veRL-style baseline's, or any plan's member whose rollout
            # runs on its own training GPUs) runs on the job's training type and count.
            allowed_types += (spec.train.gpu_type,)
            allowed_counts += tuple(spec.train.gpu_options)
        known = [g for g in slot.gpus if self.gpu_known(g)]
        types = sorted({self.topology.gpu_type_of(g) for g in known})
        if len(types) > 1:
            self.add("phases", where, f"GPUs of several types ({', '.join(types)})")
        for t in types:
            if t not in allowed_types:
                self.add("phases", where, f"GPU type {t} is not allowed (gpu_types: {', '.join(allowed_types)})")
        if slot.gpu_type is not None and types and types != [slot.gpu_type]:
            self.add("phases", where, f"gpu_type says {slot.gpu_type} but the GPUs are {', '.join(types)}")
        count = len(slot.gpus)
        if count not in allowed_counts:
            self.add("phases", where, f"{count} GPUs is not an option (gpu_options: "
                                      f"{', '.join(map(str, allowed_counts))})")

    def check_duration(self, group: GroupPlan, job: JobPlan, spec: JobSpec, one: dict[str, PhaseSlot]) -> None:
        for kind in GPU_PHASES:
            slot = one.get(kind)
            if slot is None:
                continue
            gpu_type = self.slot_type(slot)
            if gpu_type is None:
                continue  # unknown GPUs or mixed types: reported under nodes / phases
            where = _where(group, job, kind)
            try:
                need = self.model.duration(spec, kind, len(set(slot.gpus)), gpu_type)
            except ValueError as exc:
                self.add("duration", where, f"cannot model the duration: {exc}")
                continue
            if slot.duration_s < need * (1 - self.tol):
                self.add("duration", where, f"duration_s {_fmt(slot.duration_s)} is shorter than the modelled "
                                            f"{_fmt(need)} ({len(set(slot.gpus))} x {gpu_type}, "
                                            f"quantile {self.plan.quantile})")
        sync, rollout, train = one.get("sync"), one.get("rollout"), one.get("train")
        if sync is None:
            return
        where = _where(group, job, "sync")
        if rollout is not None and set(sync.gpus) != set(rollout.gpus):
            self.add("duration", where, "sync GPUs are not the job's rollout GPUs")
        if rollout is None or train is None or not self.all_known([*rollout.gpus, *train.gpus]):
            return
        try:
            need = self.model.sync_s(spec, list(dict.fromkeys(train.gpus)), list(dict.fromkeys(rollout.gpus)))
        except (ValueError, KeyError) as exc:
            self.add("duration", where, f"cannot model the sync time: {exc}")
            return
        if sync.duration_s < need * (1 - self.tol):
            self.add("duration", where, f"duration_s {_fmt(sync.duration_s)} is shorter than the modelled "
                                        f"sync time {_fmt(need)}")

    def check_chain(self, group: GroupPlan, job: JobPlan, spec: JobSpec,
                    r: PhaseSlot, t: PhaseSlot, s: PhaseSlot) -> None:
        cycle, tol = group.cycle_s, self.tol
        w1 = circular_gap(r.end_s, t.start_s, cycle, tol)
        w2 = circular_gap(t.end_s, s.start_s, cycle, tol)
        w3 = circular_gap(s.end_s, r.start_s, cycle, tol)
        busy = r.duration_s + t.duration_s + s.duration_s
        loop = busy + w1 + w2 + w3
        k = round(loop / cycle)
        where = _where(group, job)
        detail = (f"rollout {_fmt(r.duration_s)} + wait {_fmt(w1)} + train {_fmt(t.duration_s)} + wait {_fmt(w2)}"
                  f" + sync {_fmt(s.duration_s)} + wait {_fmt(w3)} = {_fmt(loop)} s")
        if abs(loop - k * cycle) > tol * max(1.0, k):
            self.add("chain", where, f"one loop is not a whole number of cycles ({detail}, cycle_s {_fmt(cycle)})")
            return
        if loop < busy - tol:
            self.add("chain", where, f"loop shorter than its phases ({detail})")
        allowed = 1 + spec.max_staleness
        if not 1 <= k <= allowed:
            self.add("chain", where, f"rollout -> train -> sync -> rollout spans {k} cycles, at most {allowed} "
                                     f"allowed with max_staleness {spec.max_staleness} ({detail}, "
                                     f"cycle_s {_fmt(cycle)})")

    def check_iteration(self, group: GroupPlan, job: JobPlan, spec: JobSpec) -> None:
        where = _where(group, job)
        if not _close(job.iteration_s, group.cycle_s, self.tol):
            self.add("iteration", where, f"iteration_s {_fmt(job.iteration_s)} != cycle_s {_fmt(group.cycle_s)}")
        try:
            solo = self.model.solo_iteration_s(spec)
        except (ValueError, KeyError) as exc:
            self.add("iteration", where, f"cannot model the solo iteration time: {exc}")
            solo = job.solo_iteration_s
        else:
            if not _close(job.solo_iteration_s, solo, self.tol):
                self.add("iteration", where, f"solo_iteration_s {_fmt(job.solo_iteration_s)} is not the "
                                             f"model's {solo!r}")
        if job.slo is not None and not _close(job.slo, spec.slo, self.tol):
            self.add("iteration", where, f"slo {_fmt(job.slo)} differs from the jobs file's {_fmt(spec.slo)}")
        limit = spec.slo * solo
        if job.iteration_s > limit * (1 + self.tol) + self.tol:
            self.add("iteration", where, f"iteration_s {_fmt(job.iteration_s)} exceeds slo {_fmt(spec.slo)} x "
                                         f"solo {_fmt(solo)} = {_fmt(limit)}")

    # ----- overlap -------------------------------------------------------------------------------
    def check_overlap(self, group: GroupPlan) -> None:
        cycle, tol = group.cycle_s, self.tol
        per_gpu: dict[str, list[_Slot]] = defaultdict(list)
        for ji, job in enumerate(group.jobs):
            spec = self.specs.get(job.name)
            for si, slot in enumerate(job.phases):
                if slot.phase in GPU_PHASES:
                    for gpu in dict.fromkeys(slot.gpus):
                        per_gpu[gpu].append(_Slot((ji, si), group, job, spec, slot))
        # (slot key a, slot key b, kind) -> GPUs; kind "busy" (plain overlap) or "switch" (only with the gaps)
        clashes: dict[tuple, list[str]] = defaultdict(list)
        detail: dict[tuple, tuple[str, str]] = {}
        for gpu, slots in per_gpu.items():
            if len(slots) < 2:
                continue
            roles = {(s.job.name, s.slot.phase) for s in slots}
            switching = len(roles) >= 2
            node = node_of(gpu) if self.gpu_known(gpu) else None
            ext = [self.switch_time(s, node) if switching else 0.0 for s in slots]
            for i in range(len(slots)):
                for j in range(i + 1, len(slots)):
                    a, b = slots[i], slots[j]
                    key_ids = tuple(sorted((a.key, b.key)))
                    busy = circular_overlap((a.slot.start_s, a.slot.duration_s),
                                            (b.slot.start_s, b.slot.duration_s), cycle, tol)
                    if busy > tol:
                        key = (*key_ids, "busy")
                        clashes[key].append(gpu)
                        detail.setdefault(key, self.describe(a, b, 0.0, 0.0, busy, cycle))
                        continue
                    if not switching:
                        continue
                    with_gap = circular_overlap((a.slot.start_s - ext[i], a.slot.duration_s + ext[i]),
                                                (b.slot.start_s - ext[j], b.slot.duration_s + ext[j]), cycle, tol)
                    if with_gap > tol:
                        key = (*key_ids, "switch")
                        clashes[key].append(gpu)
                        detail.setdefault(key, self.describe(a, b, ext[i], ext[j], with_gap, cycle))
        for key, gpus in clashes.items():
            where, message = detail[key]
            self.add("overlap", where, f"{message} on {len(gpus)} GPU(s): {_gpu_list(gpus)}")

    def switch_time(self, s: _Slot, node: str | None) -> float:
        if s.spec is None or node is None:
            return 0.0
        return self.model.switch_s(s.spec, s.slot.phase, node)

    def describe(self, a: _Slot, b: _Slot, sa: float, sb: float, amount: float, cycle: float) -> tuple[str, str]:
        where = f"group {a.group.name} / job {a.job.name} / {a.slot.phase} ~ job {b.job.name} / {b.slot.phase}"

        def span(s: _Slot, sw: float) -> str:
            text = f"[{_fmt(s.slot.start_s)}, {_fmt(s.slot.end_s)})"
            return text + (f" (+ {_fmt(sw)} s warm switch before it)" if sw else "")

        kind = "overlap" if not (sa or sb) else "overlap once warm-switch gaps are counted"
        return where, (f"{span(a, sa)} and {span(b, sb)} {kind} by {_fmt(amount)} s modulo cycle "
                       f"{_fmt(cycle)}")

    # ----- memory --------------------------------------------------------------------------------
    def check_memory(self) -> None:
        use: dict[str, dict[tuple[str, str], float]] = defaultdict(dict)
        for group in self.plan.groups:
            for job in group.jobs:
                spec = self.specs.get(job.name)
                if spec is None:
                    continue
                for slot in job.phases:
                    if slot.phase not in GPU_PHASES:
                        continue
                    for gpu in slot.gpus:
                        if self.gpu_known(gpu):
                            use[node_of(gpu)][(job.name, slot.phase)] = spec.phase(slot.phase).host_mem_gb
        for node_id in sorted(use):
            total = sum(use[node_id].values())
            cap = self.topology.nodes[node_id].host_mem_gb
            if total > cap * (1 + self.tol) + self.tol:
                parts = ", ".join(f"{j}/{p} {_fmt(gb)}" for (j, p), gb in sorted(use[node_id].items()))
                self.add("memory", f"node {node_id}",
                         f"host memory {_fmt(total)} GB exceeds the node's {_fmt(cap)} GB ({parts})")

    # ----- cost ----------------------------------------------------------------------------------
    def node_cost(self, nodes: Iterable[str]) -> float:
        return sum(self.topology.node_usd_per_hour(n) for n in nodes if n in self.topology.nodes)

    def check_cost(self) -> None:
        expected = sum(self.node_cost(g.nodes) for g in self.plan.groups)
        cost = self.plan.cost_usd_per_hour
        if not _close(cost, expected, self.tol):
            self.add("cost", "plan", f"cost_usd_per_hour {_fmt(cost)} != {_fmt(expected)}, the price of the "
                                     f"groups' nodes")
        for group in self.plan.groups:
            if group.usd_per_hour is not None:
                own = self.node_cost(group.nodes)
                if not _close(group.usd_per_hour, own, self.tol):
                    self.add("cost", f"group {group.name}", f"usd_per_hour {_fmt(group.usd_per_hour)} != "
                                                            f"{_fmt(own)}, the price of its nodes")
        bound = self.plan.lower_bound_usd_per_hour
        if bound is not None and bound > cost * (1 + self.tol) + self.tol:
            self.add("cost", "plan", f"lower_bound_usd_per_hour {_fmt(bound)} exceeds cost_usd_per_hour "
                                     f"{_fmt(cost)}")


__all__ = ["RULES", "Violation", "assert_valid", "check_plan", "circular_gap", "circular_overlap",
           "circular_segments", "format_violations"]
