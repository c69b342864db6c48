"""Regrouping: a large-neighbourhood search that re-partitions a few groups' jobs exactly.

Where column generation cannot settle (300 rollout-heavy jobs in 30 s) the plan built half by half
(planner/halves.py) is the start, and it wastes nodes in a way no set of generated columns fixes:
its rollout classes pair every job that can pair, so groups whose jobs all pair hold four jobs
(two rollout nodes each) where five jobs, one of them alone on its rollout node, would save a
training node. Saving one needs five or more groups re-cut at once.

So a window of groups of similar cycle caps (about 25 jobs) is re-partitioned by a compact CP-SAT
model with the candidate rules of planner/optimal.py, and the result kept when it costs less:
- ``x[j, g]``: job j in group g (one each, at most ``k`` per group); ``key[g, t]``: the group's
  training option (one per group, shared by its members); ``c[g]``: the group's cycle cap, at
  most every member's ``slo * solo`` and at least each member's loop and phase;
- trains (and warm switches, when shared) within ``c[g]``, their host memory within a node's;
- rollout nodes: each job leads one (``lead[j]``) or rides on a leader's (``ride[j, i]``, same
  group and cluster); a node's rollouts (with warm switches when shared) fit ``c[g]``, its host
  memory a node's;
- cost: training nodes plus rollout nodes; the window's jobs keep to the nodes free.

It applies where every job has one training and one rollout option of one node each (every
generator family in bench/planner_scale.py); elsewhere it returns the plan unchanged. Measured on
300 RH jobs (30 s in all, about 15 s of regrouping, each group's timetable checked): from the plan by
halves' $5,733 / $5,820 / $5,686 to $5,638-5,653 / $5,699 / $5,549 (s1-s3), 3-5 training nodes fewer.
Windows of 25 jobs (about 0.5 s each) did better than 35 (1.5 s) or a mix; 60 s of 45-job windows
reached $5,562 on s3.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable

from ortools.sat.python import cp_model

from weave_rl.planner.optimal import Candidate, CandidateBuilder, PhaseOption, make_candidate
from weave_rl.planner.rules import group_fits

MS = 1000  # times in whole milliseconds (every duration is already rounded up to them)
WINDOW_JOBS = 25  # jobs per window (saving a training node needs five groups or more re-cut at once)
SOLVE_S = 0.8  # most seconds per window (windows of 25 jobs settle in about half a second)
CENT = 100  # costs in cents
ROOMY_ONLY = 0.25  # the share of windows made of groups with room only


@dataclass(frozen=True)
class _Job:
    train: PhaseOption
    rollout: PhaseOption
    cap: int  # slo * solo, ms (rounded down)
    floor: int  # the least cap of any group holding it: its loop and each phase alone, ms


def eligible(builder: CandidateBuilder) -> bool:
    """Every job has one training and one rollout option, each on one node."""
    return all(len(builder.train_opts[j]) == 1 and len(builder.rollout_opts[j]) == 1
               and builder.train_opts[j][0].nodes == 1 and builder.rollout_opts[j][0].nodes == 1
               for j in builder.job_ids)


def regroup(builder: CandidateBuilder, groups: list[Candidate], deadline: float, threads: int = 1,
            seed: int = 0, others: dict[str, int] | None = None,
            timetabled: Callable[[Candidate], bool] | None = None) -> list[Candidate]:
    """The groups improved window by window until ``deadline``, each with its cheapest rollout
    classes (unchanged when not ``eligible``); ``others``: nodes per cluster the plan's other
    groups hold. With ``timetabled``, every group returned passes it (the candidate rules are
    necessary conditions only: on 300 RH jobs a few groups in 60 have no timetable, some of them
    from the plan by halves); no group holding all the jobs of one that failed is formed again."""
    if not groups or not eligible(builder):
        return groups
    search = _Search(builder, groups, threads, others or {}, timetabled)
    rng = random.Random(seed)
    while time.perf_counter() < deadline - 0.1:
        window = search.window(rng, WINDOW_JOBS)
        better = search.solve(window, min(SOLVE_S, deadline - time.perf_counter()))
        if better is not None:
            search.replace(window, better)
    return [search.candidate(search.polish(g)) for g in search.groups]


Group = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]  # jobs, rollout classes (jobs sharing a node)


class _Search:
    def __init__(self, builder: CandidateBuilder, groups: list[Candidate], threads: int, others: dict[str, int],
                 timetabled: Callable[[Candidate], bool] | None):
        self.b = builder
        self.threads = threads
        self._timetabled = timetabled
        self._timetables: dict[Group, bool] = {}
        self.failed: list[frozenset[int]] = []  # job sets whose group had no timetable
        self.jobs = {}
        for j in builder.job_ids:
            t, r = builder.train_opts[j][0], builder.rollout_opts[j][0]
            floor = max(builder.loop_s(j, t, r), t.duration_s, r.duration_s)
            self.jobs[j] = _Job(t, r, math.floor(builder.cap[j] * MS + 1e-6), math.ceil(floor * MS - 1e-6))
        self.groups: list[Group] = [(c.jobs, tuple(tuple(c.jobs[i] for i in cls) for cls in c.classes))
                                    for c in groups]
        self.node_mem = {c: spec.host_mem_gb for c, spec in builder.topo.clusters.items()}
        used = dict(others)
        for g in self.groups:
            for cluster, n in self.nodes_of(g).items():
                used[cluster] = used.get(cluster, 0) + n
        self.free = {c: spec.nodes - used.get(c, 0) for c, spec in builder.topo.clusters.items()}
        if timetabled is not None:  # groups given without a timetable are mended first
            self.groups = [m for g in self.groups for m in self.mend(g)]

    # ----- bookkeeping -------------------------------------------------------------------------
    def nodes_of(self, g: Group) -> dict[str, int]:
        nodes = {self.jobs[g[0][0]].train.cluster: 1}
        for cls in g[1]:
            cluster = self.jobs[cls[0]].rollout.cluster
            nodes[cluster] = nodes.get(cluster, 0) + 1
        return nodes

    def cost(self, g: Group) -> float:
        return sum(self.b.price[c] * n for c, n in self.nodes_of(g).items())

    def cap(self, g: Group) -> int:
        return min(self.jobs[j].cap for j in g[0])

    def window(self, rng: random.Random, jobs: int) -> list[int]:
        """A group (one with room, mostly) and the groups nearest it in cycle cap, randomly spread,
        up to ``jobs`` jobs."""
        roomy = {i for i, g in enumerate(self.groups) if len(g[0]) < self.b.k}
        first = rng.choice(sorted(roomy) if roomy and rng.random() < 0.7 else range(len(self.groups)))
        at = math.log(self.cap(self.groups[first]))
        # Half the time the other groups with room come first: merging them saves a training node;
        # sometimes only they come (five with one place each, however far apart, save one).
        pull = 0.5 if rng.random() < 0.5 else 1.0
        only_roomy = first in roomy and rng.random() < ROOMY_ONLY
        others = sorted((i for i in range(len(self.groups)) if i != first and (i in roomy or not only_roomy)),
                        key=lambda i: abs(math.log(self.cap(self.groups[i])) - at) * rng.uniform(0.5, 1.5)
                        * (pull if i in roomy else 1.0))
        window, size = [first], len(self.groups[first][0])
        for i in others:
            if size + len(self.groups[i][0]) <= jobs:
                window.append(i)
                size += len(self.groups[i][0])
        return window

    def replace(self, window: list[int], better: list[Group]) -> None:
        for i in window:
            for c, n in self.nodes_of(self.groups[i]).items():
                self.free[c] += n
        for g in better:
            for c, n in self.nodes_of(g).items():
                self.free[c] -= n
        gone = set(window)
        self.groups = [g for i, g in enumerate(self.groups) if i not in gone] + better

    def candidate(self, g: Group) -> Candidate:
        jobs = list(g[0])
        at = {j: i for i, j in enumerate(jobs)}
        return make_candidate(self.b, jobs, [self.jobs[j].train for j in jobs], [self.jobs[j].rollout for j in jobs],
                          [[at[j] for j in cls] for cls in g[1]], [0] * len(jobs))

    # ----- one window -------------------------------------------------------------------------
    def solve(self, window: list[int], limit_s: float) -> list[Group] | None:
        """The window's jobs re-partitioned at least cost; None unless cheaper than now and valid."""
        old = [self.groups[i] for i in window]
        model = _Window(self, old)
        new = model.solve(limit_s)
        if new is None or not all(self.valid(g) for g in new):
            return None
        new = [self.polish(g) for g in new]
        if sum(map(self.cost, new)) >= sum(map(self.cost, old)) - 1e-6:
            return None
        for g in new:
            if g not in old and not self.timetabled(g):
                self.failed.append(frozenset(g[0]))
                return None
        return new

    def timetabled(self, g: Group) -> bool:
        """Whether the group has a timetable (always, without a check to ask)."""
        if self._timetabled is None:
            return True
        if g not in self._timetables:
            self._timetables[g] = self._timetabled(self.candidate(g))
        return self._timetables[g]

    def mend(self, g: Group) -> list[Group]:
        """The group if it has a timetable; else its next configuration that has one; else its
        tightest member (largest floor against the cap) alone and the rest mended again. The job
        set that failed is not formed again."""
        if self.timetabled(g):
            return [g]
        self.failed.append(frozenset(g[0]))
        for config in self.b._configs(list(g[0])):
            other = (config.jobs, tuple(tuple(config.jobs[i] for i in cls) for cls in config.classes))
            if other != g and self.timetabled(other):
                return [other]
        tightest = max(g[0], key=lambda j: self.jobs[j].floor / self.cap(g))
        rest = tuple(j for j in g[0] if j != tightest)
        alone = ((tightest,), ((tightest,),))
        if not rest:
            return [alone]
        at = [tuple(j for j in cls if j != tightest) for cls in g[1]]
        return [alone] + self.mend((rest, tuple(cls for cls in at if cls)))

    def polish(self, g: Group) -> Group:
        """The group's cheapest rollout classes that have a timetable (a model stopped by its time
        limit may leave a rollout node to spare inside a group)."""
        configs = self.b._configs(list(g[0]))
        if configs and configs[0].cost < self.cost(g) - 1e-6:
            best = configs[0]
            cheaper = best.jobs, tuple(tuple(best.jobs[i] for i in cls) for cls in best.classes)
            if self.timetabled(cheaper):
                return cheaper
        return g

    def may_share(self, i: int, j: int) -> bool:
        """Whether j's rollout may ride on i's node: both may share a group (one training option,
        each one's floor within the other's cap) and their rollouts a node (one cluster, both
        with warm switches within the smaller cap, host memory within the node's)."""
        a, b = self.jobs[i], self.jobs[j]
        cap = min(a.cap, b.cap)
        return _key(a.train) == _key(b.train) and a.rollout.cluster == b.rollout.cluster \
            and max(a.floor, b.floor) <= cap \
            and _ms(a.rollout.duration_s + a.rollout.switch_s) + _ms(b.rollout.duration_s + b.rollout.switch_s) <= cap \
            and a.rollout.host_mem_gb + b.rollout.host_mem_gb <= self.node_mem[a.rollout.cluster]

    def valid(self, g: Group) -> bool:
        """The group rules (planner/rules.py), checked again on the model's answer; regrouping
        forms pools of one training option only."""
        jobs, classes = g
        trains = [self.jobs[j].train for j in jobs]
        if len({_key(t) for t in trains}) > 1:
            return False
        at = {j: i for i, j in enumerate(jobs)}
        return group_fits(self.b, list(jobs), trains, [self.jobs[j].rollout for j in jobs],
                          [[at[j] for j in cls] for cls in classes])


class _Window:
    """The compact CP-SAT model of one window's groups (see the module docstring)."""

    def __init__(self, search: _Search, old: list[Group]):
        self.search, self.old = search, old
        self.J = search.jobs
        self.jobs = sorted(j for g in old for j in g[0])
        self.cp = cp_model.CpModel()
        self._groups()
        self._rollout_nodes()
        self._nodes_and_cost()
        self._hint()

    def _groups(self) -> None:
        """Membership, training option, cap, trains and their memory per group."""
        cp, J, jobs, k = self.cp, self.J, self.jobs, self.search.b.k
        m = len(self.old)
        self.keys = sorted({_key(J[j].train) for j in jobs})
        self.key_of = {j: self.keys.index(_key(J[j].train)) for j in jobs}
        self.x = {(j, g): cp.new_bool_var(f"x{j}_{g}") for j in jobs for g in range(m)}
        self.key = {(g, t): cp.new_bool_var(f"k{g}_{t}") for g in range(m) for t in range(len(self.keys))}
        self.shared = [cp.new_bool_var(f"s{g}") for g in range(m)]  # two members or more
        self.cap = [cp.new_int_var(0, max(J[j].cap for j in jobs), f"c{g}") for g in range(m)]
        x, key, cap = self.x, self.key, self.cap
        for j in jobs:
            cp.add_exactly_one(x[j, g] for g in range(m))
        for g in range(m):
            members = [x[j, g] for j in jobs]
            cp.add(sum(members) <= k)
            cp.add(sum(members) <= 1 + (k - 1) * self.shared[g])
            cp.add(sum(key[g, t] for t in range(len(self.keys))) <= 1)
            for j in jobs:
                cp.add_implication(x[j, g], key[g, self.key_of[j]])
                cp.add(cap[g] <= J[j].cap).only_enforce_if(x[j, g])
                cp.add(cap[g] >= J[j].floor).only_enforce_if(x[j, g])
            busy = sum(_ms(J[j].train.duration_s + J[j].train.switch_s) * x[j, g] for j in jobs)
            cp.add(busy <= cap[g]).only_enforce_if(self.shared[g])
            for t, (_, cluster, _) in enumerate(self.keys):
                mem = sum(_gb(J[j].train.host_mem_gb) * x[j, g] for j in jobs if self.key_of[j] == t)
                cp.add(mem <= _gb(self.search.node_mem[cluster]))
            for failed in self.search.failed:
                if failed <= set(jobs):
                    cp.add(sum(x[j, g] for j in failed) <= len(failed) - 1)
            if g:  # groups are interchangeable: the used ones first
                cp.add(sum(key[g, t] for t in range(len(self.keys)))
                       <= sum(key[g - 1, t] for t in range(len(self.keys))))

    def _rollout_nodes(self) -> None:
        """Each job leads a rollout node or rides on a leader's (same group and cluster); a node's
        rollouts (warm switches when shared) within its group's cap, its host memory a node's."""
        cp, J, jobs, x = self.cp, self.J, self.jobs, self.x
        self.lead = {j: cp.new_bool_var(f"l{j}") for j in jobs}
        self.ride = {(j, i): cp.new_bool_var(f"r{j}_{i}") for j in jobs for i in jobs
                     if i != j and self.search.may_share(i, j)}
        self.riders = {i: [j for j in jobs if (j, i) in self.ride] for i in jobs}
        self.busy = {}  # leader -> its node holds riders (the leader switches too)
        lead, ride = self.lead, self.ride
        for j in jobs:
            cp.add_exactly_one([lead[j]] + [ride[j, i] for i in jobs if (j, i) in ride])
        for i, riders in self.riders.items():
            if not riders:
                continue
            ro = J[i].rollout
            busy = self.busy[i] = cp.new_bool_var(f"b{i}")
            for j in riders:
                cp.add_implication(ride[j, i], lead[i])
                cp.add_implication(ride[j, i], busy)
                for g in range(len(self.old)):  # a rider sits in its leader's group
                    cp.add_bool_or([ride[j, i].Not(), x[i, g].Not(), x[j, g]])
            load = _ms(ro.duration_s) * lead[i] + _ms(ro.switch_s) * busy + sum(
                _ms(J[j].rollout.duration_s + J[j].rollout.switch_s) * ride[j, i] for j in riders)
            for g in range(len(self.old)):
                cp.add(self.cap[g] >= load).only_enforce_if(x[i, g])
            cp.add(_gb(ro.host_mem_gb) * lead[i] + sum(_gb(J[j].rollout.host_mem_gb) * ride[j, i] for j in riders)
                   <= _gb(self.search.node_mem[ro.cluster]))

    def _nodes_and_cost(self) -> None:
        """The window keeps to the nodes it holds plus the free ones; its cost is its nodes'."""
        cp, J, jobs, m = self.cp, self.J, self.jobs, len(self.old)
        for cluster in {J[j].rollout.cluster for j in jobs} | {J[j].train.cluster for j in jobs}:
            have = sum(self.search.nodes_of(g).get(cluster, 0) for g in self.old) + self.search.free[cluster]
            used = [self.lead[j] for j in jobs if J[j].rollout.cluster == cluster]
            used += [self.key[g, t] for g in range(m) for t, key in enumerate(self.keys) if key[1] == cluster]
            cp.add(sum(used) <= have)
        price = self.search.b.price
        cost = sum(_cents(price[key[1]]) * self.key[g, t] for g in range(m) for t, key in enumerate(self.keys)) \
            + sum(_cents(price[J[j].rollout.cluster]) * self.lead[j] for j in jobs)
        cp.minimize(cost)

    def _hint(self) -> None:
        """The window's current groups, as a complete solution."""
        cp, J = self.cp, self.J
        leader = {j: cls[0] for _, classes in self.old for cls in classes for j in cls}
        for g, (members, _) in enumerate(self.old):
            for j in self.jobs:
                cp.add_hint(self.x[j, g], j in members)
            for t in range(len(self.keys)):
                cp.add_hint(self.key[g, t], t == self.key_of[members[0]])
            cp.add_hint(self.shared[g], len(members) > 1)
            cp.add_hint(self.cap[g], min(J[j].cap for j in members))
        for j in self.jobs:
            cp.add_hint(self.lead[j], leader[j] == j)
        for (j, i), var in self.ride.items():
            cp.add_hint(var, leader[j] == i)
        for i, busy in self.busy.items():
            cp.add_hint(busy, any(leader[j] == i for j in self.riders[i]))

    def solve(self, limit_s: float) -> list[Group] | None:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, limit_s)
        solver.parameters.num_workers = max(1, self.search.threads)
        if solver.solve(self.cp) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        new: list[Group] = []
        for g in range(len(self.old)):
            members = tuple(j for j in self.jobs if solver.value(self.x[j, g]))
            if members:
                classes = tuple((i,) + tuple(j for j in self.riders[i] if solver.value(self.ride[j, i]))
                                for i in members if solver.value(self.lead[i]))
                new.append((members, classes))
        return new


def _key(option: PhaseOption) -> tuple:
    return option.gpu_type, option.cluster, option.gpus


def _ms(seconds: float) -> int:
    return math.ceil(seconds * MS - 1e-6)


def _gb(gb: float) -> int:
    return math.ceil(gb * 10 - 1e-6)  # tenths of a GB, rounded up: never admits more than fits


def _cents(usd: float) -> int:
    return int(round(usd * CENT))
