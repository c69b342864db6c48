"""An exhaustive cost optimum for small instances, written independently of ``planner/optimal.py``.

Scope: jobs whose phases each have a single option that fills exactly one node (the BL/RH/TH/Mixed
families: 8 H20 rollout GPUs + 8 H800 train GPUs). A group is a set ``S`` of at most
``max_group_size`` jobs sharing one training node, with ``S`` split into rollout *classes* (the jobs
of a class share one rollout node). It costs one training node plus one rollout node per class.

1. For every subset ``S`` and every set partition of ``S`` into classes (fewest classes first; the
   cost only depends on their number, so the first feasible one is the cheapest), the group is
   feasible iff host memory fits on every node and ``weave_rl.planner.timetable.solve_timetable`` (the exact
   cyclic timetable that defines the model, with SLOs enforced) finds a timetable on concrete nodes
   (``train-000`` and ``rollout-000``, ``rollout-001``, ...).
2. Feasibility is hereditary (dropping a job from a feasible group leaves a feasible group: fewer
   phases, fewer warm switches, a looser cycle cap), so a subset with an infeasible sub-subset, or a
   partition whose restriction to a sub-subset is known infeasible, is skipped without a solve, as is
   one that fails a necessary load condition (train or rollout busy time, a job's own loop, above
   the group's cycle cap ``min(slo * solo)``). Skipped subsets are infeasible, so the search stays
   exhaustive.
3. The cheapest cover of all jobs by disjoint feasible groups: a dynamic program over bitmasks of
   jobs, keeping per mask every Pareto-minimal (training nodes, rollout nodes) pair so that the
   clusters' node counts are respected exactly.

Jobs that are infeasible even alone (e.g. SLO below 1) are left out and returned as rejected.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterator

from weave_rl.planner.model import PlanningModel
from weave_rl.planner.timetable import Member, solve_timetable
from weave_rl.profiles.jobs import JobSpec

EPS = 1e-6


@dataclass
class BruteForceStats:
    subsets: int = 0  # subsets looked at
    feasible_subsets: int = 0
    timetable_solves: int = 0
    pruned: int = 0  # (subset, partition)s skipped on a necessary condition
    unknown: list[tuple[str, ...]] = field(default_factory=list)  # solves that hit the time limit
    rejected: list[str] = field(default_factory=list)


def _partitions(items: tuple[int, ...]) -> Iterator[list[tuple[int, ...]]]:
    """All set partitions of ``items`` (written here rather than borrowed from planner.optimal)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for sub in _partitions(rest):
        yield [(head,)] + sub
        for i in range(len(sub)):
            yield sub[:i] + [(head,) + sub[i]] + sub[i + 1:]


class BruteForce:
    def __init__(self, model: PlanningModel, max_group_size: int = 5, time_limit_s: float = 30.0,
                 threads: int = 2):
        self.model = model
        self.k = max_group_size
        self.time_limit_s = time_limit_s
        self.threads = threads
        self.jobs: list[JobSpec] = list(model.jobs.jobs)
        self.stats = BruteForceStats()
        topo = model.topology
        self.rollout_cluster = self._cluster_of(self.jobs, "rollout")
        self.train_cluster = self._cluster_of(self.jobs, "train")
        if self.rollout_cluster.name == self.train_cluster.name:
            raise NotImplementedError("brute force assumes rollout and train in different clusters")
        self.rollout_nodes = [n.id for n in topo.nodes_in(cluster=self.rollout_cluster.name)]
        self.train_nodes = [n.id for n in topo.nodes_in(cluster=self.train_cluster.name)]
        self.rollout_price = self.rollout_cluster.gpus_per_node * topo.gpu_types[self.rollout_cluster.gpu_type].usd_per_hour
        self.train_price = self.train_cluster.gpus_per_node * topo.gpu_types[self.train_cluster.gpu_type].usd_per_hour
        # Per job: durations on one node (ms-rounded, as the timetable uses), switch times, cap.
        self.cap = [j.slo * model.solo[j.name] for j in self.jobs]
        self.partition_ok: dict[frozenset, bool] = {}
        self.subset_best: dict[tuple[int, ...], tuple[float, list[tuple[int, ...]]] | None] = {}

    def _cluster_of(self, jobs: list[JobSpec], kind: str):
        topo = self.model.topology
        clusters = set()
        for job in jobs:
            phase = job.phase(kind)
            if len(phase.gpu_options) != 1 or len(phase.gpu_types) != 1:
                raise NotImplementedError(f"{job.name}: brute force needs single-option phases")
            matches = [c for c in topo.clusters.values() if c.gpu_type == phase.gpu_type]
            if len(matches) != 1:
                raise NotImplementedError(f"{job.name}: {kind} needs exactly one cluster of {phase.gpu_type}")
            if phase.gpus != matches[0].gpus_per_node:
                raise NotImplementedError(f"{job.name}: {kind} must fill exactly one node")
            clusters.add(matches[0].name)
        if len(clusters) != 1:
            raise NotImplementedError(f"brute force needs one {kind} cluster for all jobs")
        return topo.clusters[clusters.pop()]

    # ----- one group -------------------------------------------------------------------------
    def _members(self, partition: list[tuple[int, ...]]) -> list[Member]:
        topo = self.model.topology
        train_gpus = tuple(topo.node(self.train_nodes[0]).gpu_ids)
        members = []
        for c, cls in enumerate(partition):
            rollout_gpus = tuple(topo.node(self.rollout_nodes[c]).gpu_ids)
            members += [Member(self.jobs[j], rollout_gpus, train_gpus) for j in cls]
        return members

    def _quick_infeasible(self, subset: tuple[int, ...], partition: list[tuple[int, ...]]) -> bool:
        """Necessary conditions (sound: a True here means no timetable exists)."""
        model = self.model
        cap = min(self.cap[j] for j in subset)
        if any(sum(self.jobs[j].rollout.host_mem_gb for j in cls) > self.rollout_cluster.host_mem_gb + EPS
               for cls in partition):
            return True
        if sum(self.jobs[j].train.host_mem_gb for j in subset) > self.train_cluster.host_mem_gb + EPS:
            return True
        train_node = self.train_nodes[0]
        shared_train = len(subset) > 1
        busy = 0.0
        for j in subset:
            job = self.jobs[j]
            busy += model.duration(job, "train", job.train.gpus, job.train.gpu_type)
            if shared_train:
                busy += model.switch_s(job, "train", train_node)
        if busy > cap + EPS:
            return True
        for c, cls in enumerate(partition):
            if len(cls) < 2:
                continue
            node = self.rollout_nodes[c]
            load = sum(model.duration(self.jobs[j], "rollout", self.jobs[j].rollout.gpus, self.jobs[j].rollout.gpu_type)
                       + model.switch_s(self.jobs[j], "rollout", node) for j in cls)
            if load > cap + EPS:
                return True
        # Sub-partitions known to be infeasible (heredity).
        for j in subset:
            sub = [tuple(x for x in cls if x != j) for cls in partition]
            key = frozenset(frozenset(cls) for cls in sub if cls)
            if self.partition_ok.get(key) is False:
                return True
        return False

    def _partition_feasible(self, subset: tuple[int, ...], partition: list[tuple[int, ...]]) -> bool:
        key = frozenset(frozenset(cls) for cls in partition)
        if key in self.partition_ok:
            return self.partition_ok[key]
        if len(partition) > len(self.rollout_nodes) or not self.train_nodes:
            ok = False
        elif self._quick_infeasible(subset, partition):
            self.stats.pruned += 1
            ok = False
        else:
            self.stats.timetable_solves += 1
            tt = solve_timetable(self.model, self._members(partition), enforce_slo=True,
                                 time_limit_s=self.time_limit_s, threads=self.threads)
            if tt.status == "UNKNOWN":
                tt = solve_timetable(self.model, self._members(partition), enforce_slo=True,
                                     time_limit_s=4 * self.time_limit_s, threads=self.threads)
                if tt.status == "UNKNOWN":
                    self.stats.unknown.append(tuple(self.jobs[j].name for j in subset))
            ok = tt.ok
        self.partition_ok[key] = ok
        return ok

    def subset_cost(self, subset: tuple[int, ...]) -> tuple[float, list[tuple[int, ...]]] | None:
        """Cheapest feasible (cost, partition) of one group, or None."""
        if subset in self.subset_best:
            return self.subset_best[subset]
        self.stats.subsets += 1
        result = None
        # Heredity: every subset one job smaller must be feasible.
        if len(subset) > 1 and any(self.subset_cost(tuple(x for x in subset if x != j)) is None for j in subset):
            self.subset_best[subset] = None
            return None
        by_classes = sorted(_partitions(subset), key=len)
        for partition in by_classes:
            if self._partition_feasible(subset, partition):
                result = (self.train_price + len(partition) * self.rollout_price, partition)
                break
        if result is not None:
            self.stats.feasible_subsets += 1
        self.subset_best[subset] = result
        return result

    # ----- cover ---------------------------------------------------------------------------
    def solve(self) -> tuple[float, list[list[tuple[str, ...]]]]:
        n = len(self.jobs)
        alone = [j for j in range(n) if self.subset_cost((j,)) is not None]
        self.stats.rejected = [self.jobs[j].name for j in range(n) if j not in alone]
        groups: dict[int, tuple[tuple[int, ...], int]] = {}  # mask -> (subset, classes)
        for size in range(1, min(self.k, len(alone)) + 1):
            for subset in itertools.combinations(alone, size):
                best = self.subset_cost(subset)
                if best is not None:
                    groups[sum(1 << j for j in subset)] = (subset, len(best[1]))
        full = sum(1 << j for j in alone)
        # DP over masks of the admissible jobs: Pareto set of (train nodes, rollout nodes) -> choice.
        table: dict[int, dict[tuple[int, int], tuple[int, tuple[int, int]] | None]] = {0: {(0, 0): None}}
        order = sorted({m for m in _submasks(full)}, key=lambda m: bin(m).count("1"))
        for mask in order:
            if mask == 0:
                continue
            low = mask & -mask
            entries: dict[tuple[int, int], tuple[int, tuple[int, int]]] = {}
            for sub in _submasks(mask):
                if not sub & low or sub not in groups:
                    continue
                rest = mask ^ sub
                for (t, r) in table.get(rest, {}):
                    key = (t + 1, r + groups[sub][1])
                    if key[0] > len(self.train_nodes) or key[1] > len(self.rollout_nodes):
                        continue
                    entries.setdefault(key, (sub, (t, r)))
            table[mask] = {k: v for k, v in entries.items()
                           if not any(o != k and o[0] <= k[0] and o[1] <= k[1] for o in entries)}
        final = table.get(full, {})
        if not final:
            raise RuntimeError("no cover of the jobs fits the topology's node counts")
        key = min(final, key=lambda tr: tr[0] * self.train_price + tr[1] * self.rollout_price)
        cost = round(key[0] * self.train_price + key[1] * self.rollout_price, 6)
        chosen: list[list[tuple[str, ...]]] = []
        mask = full
        while mask:
            sub, prev = table[mask][key]
            subset = groups[sub][0]
            _, partition = self.subset_best[subset]
            chosen.append([tuple(self.jobs[j].name for j in cls) for cls in partition])
            mask, key = mask ^ sub, prev
        chosen.sort()
        return cost, chosen


# ----- the throughput objective ------------------------------------------------------------------
class BruteForceThroughput(BruteForce):
    """The most job-iterations per $ over every plan that places every admissible job.

    Every subset ``S`` of at most ``max_group_size`` jobs and every partition of ``S`` into rollout
    classes is timetabled at its *shortest* cycle (``solve_timetable`` minimises it; a group's
    jobs each run once per cycle), which is the best a fixed group can do: its cost is fixed. So a
    group's options are (cost, iterations per hour ``|S| * 3600 / cycle``), one per feasible
    partition; only the Pareto-best per class count is kept (more iterations at the same cost can
    only raise the ratio). Then every set partition of the jobs into feasible groups, and every
    combination of their options within the topology's node counts, is evaluated: the ratio
    ``sum iterations/h / sum $/h`` is not additive, so nothing is decomposed."""

    def group_options(self, subset: tuple[int, ...]) -> list[tuple[int, float, list[tuple[int, ...]]]]:
        """(classes, iterations per hour, partition), the best per class count; [] when infeasible."""
        key = ("throughput", subset)
        if key in self.subset_best:
            return self.subset_best[key]  # type: ignore[return-value]
        best: dict[int, tuple[int, float, list[tuple[int, ...]]]] = {}
        if len(subset) == 1 or all(self.group_options(tuple(x for x in subset if x != j)) for j in subset):
            for partition in _partitions(subset):
                if len(partition) > len(self.rollout_nodes) or self._quick_infeasible(subset, partition):
                    continue
                self.stats.timetable_solves += 1
                tt = solve_timetable(self.model, self._members(partition), enforce_slo=True,
                                     time_limit_s=self.time_limit_s, threads=self.threads)
                if tt.ok and tt.status != "OPTIMAL":
                    self.stats.unknown.append(tuple(self.jobs[j].name for j in subset))
                if not tt.ok:
                    if tt.status == "UNKNOWN":
                        self.stats.unknown.append(tuple(self.jobs[j].name for j in subset))
                    continue
                per_hour = len(subset) * 3600.0 / tt.cycle_s
                if len(partition) not in best or per_hour > best[len(partition)][1]:
                    best[len(partition)] = (len(partition), per_hour, partition)
        # Pareto: more classes (dearer) only when they give more iterations.
        out, top = [], -1.0
        for classes in sorted(best):
            if best[classes][1] > top + EPS:
                out.append(best[classes])
                top = best[classes][1]
        self.subset_best[key] = out  # type: ignore[assignment]
        return out

    def solve(self) -> tuple[float, list[list[tuple[str, ...]]]]:  # type: ignore[override]
        n = len(self.jobs)
        alone = [j for j in range(n) if self.group_options((j,))]
        self.stats.rejected = [self.jobs[j].name for j in range(n) if j not in alone]
        best: tuple[float, list] | None = None
        for grouping in _partitions(tuple(alone)):
            if any(len(g) > self.k for g in grouping):
                continue
            options = [self.group_options(g) for g in grouping]
            if not all(options):
                continue
            for combo in itertools.product(*options):
                rollout = sum(o[0] for o in combo)
                if len(grouping) > len(self.train_nodes) or rollout > len(self.rollout_nodes):
                    continue
                cost = len(grouping) * self.train_price + rollout * self.rollout_price
                ratio = sum(o[1] for o in combo) / cost
                if best is None or ratio > best[0] + EPS:
                    best = (ratio, [[tuple(self.jobs[j].name for j in cls) for cls in o[2]] for o in combo])
        if best is None:
            raise RuntimeError("no plan of every admissible job fits the topology's node counts")
        return best[0], sorted(best[1])


def brute_force_throughput(model: PlanningModel, max_group_size: int = 5, *, time_limit_s: float = 30.0,
                           threads: int = 2, stats: BruteForceStats | None = None
                           ) -> tuple[float, list[list[tuple[str, ...]]]]:
    """Exhaustive optimum of the throughput objective: job-iterations per $ and its groups (each a
    list of rollout classes of job names), every admissible job placed. Small instances only (it
    enumerates every set partition of the jobs)."""
    return _solve(BruteForceThroughput(model, max_group_size, time_limit_s, threads), stats)


def _submasks(mask: int) -> Iterator[int]:
    sub = mask
    while True:
        yield sub
        if sub == 0:
            return
        sub = (sub - 1) & mask


def brute_force_cost(model: PlanningModel, max_group_size: int = 5, *, time_limit_s: float = 30.0,
                     threads: int = 2, stats: BruteForceStats | None = None
                     ) -> tuple[float, list[list[tuple[str, ...]]]]:
    """Exhaustive optimum $/h and its groups (each a list of rollout classes of job names).

    Pass a ``BruteForceStats`` to read how much work it took (and any timetable solve that hit its
    time limit, which would make the result an upper bound rather than the optimum).
    """
    return _solve(BruteForce(model, max_group_size, time_limit_s, threads), stats)


def _solve(bf: BruteForce, stats: BruteForceStats | None) -> tuple[float, list[list[tuple[str, ...]]]]:
    """``bf.solve()``, copying its work counters into ``stats`` when given."""
    out = bf.solve()
    if stats is not None:
        for name in ("subsets", "feasible_subsets", "timetable_solves", "pruned", "unknown", "rejected"):
            setattr(stats, name, getattr(bf.stats, name))
    return out
