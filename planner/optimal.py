"""Candidate co-execution groups of the ``optimal`` policy, and how a chosen one is laid out.

A candidate is a set of at most ``max_group_size`` jobs with a shared training pool (nodes of one
cluster, as many as its widest member's training option) and a partition of the members into
rollout classes (jobs in a class share rollout nodes). In the pool as in a class, a narrower member
takes a run of the nodes (the paper's spatial multiplexing: two 8-GPU jobs each on one node of a
16-GPU job's pool), laid out so that every node's busy time fits (``class_layout``). A candidate
survives when it keeps the group rules of planner/rules.py under its cap ``min(slo * solo)``: each
training and rollout node's busy time (warm switches included where shared), each job's own loop,
and host memory per node. ``CandidateBuilder`` grows sets depth-first and prunes as soon as a necessary
condition fails (all of them only get harder when a job is added); with a budget it gives up on
large instances, which planner/colgen.py then prices instead of enumerating.

How the master picks candidates and the bound it proves: planner/optimize.py.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from weave_rl.planner.colocated import colocated_options, shared_pools
from weave_rl.planner.model import PlanningModel, ceil_ms
from weave_rl.planner.plan import GroupPlan, Rejection
from weave_rl.planner.rules import TIME_TOL, class_layout, fits_cap, fits_memory, group_cap, load_s, member_cap
from weave_rl.planner import roundrobin
from weave_rl.planner.timetable import Member, Timetable
from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import Topology

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PhaseOption:
    gpus: int
    gpu_type: str
    cluster: str
    nodes: int  # whole nodes the phase needs
    duration_s: float
    switch_s: float
    host_mem_gb: float


@dataclass(frozen=True)
class Candidate:
    jobs: tuple[int, ...]
    trains: tuple[PhaseOption, ...]  # per member, one cluster: the group's training pool
    rollouts: tuple[PhaseOption, ...]  # per member, same order as jobs
    classes: tuple[tuple[int, ...], ...]  # positions in ``jobs`` that share rollout nodes
    offsets: tuple[int, ...]  # per member: first node of its rollout inside its class's nodes
    train_offsets: tuple[int, ...]  # per member: first node of its train inside the pool's nodes
    cost: float
    nodes: tuple[tuple[str, int], ...]  # (cluster, node count)

    @property
    def pool(self) -> PhaseOption:
        """The widest member's training option: the pool's cluster and node count."""
        return max(self.trains, key=lambda t: t.nodes)


def make_candidate(builder: "CandidateBuilder", jobs: list[int], trains: PhaseOption | list[PhaseOption],
                   rollouts: list[PhaseOption], classes: list[list[int]], offsets: list[int] | None = None,
                   train_offsets: list[int] | None = None) -> Candidate:
    """The one constructor of candidates: nodes and $/h from the pool's and the classes' widths.
    ``trains`` is one option for a pool every member uses whole, or one per member."""
    trains = [trains] * len(jobs) if isinstance(trains, PhaseOption) else list(trains)
    nodes: dict[str, int] = {trains[0].cluster: max(t.nodes for t in trains)}
    for cls in classes:
        cluster = rollouts[cls[0]].cluster
        nodes[cluster] = nodes.get(cluster, 0) + max(rollouts[i].nodes for i in cls)
    cost = sum(builder.price[c] * n for c, n in nodes.items())
    zeros = (0,) * len(jobs)
    return Candidate(tuple(jobs), tuple(trains), tuple(rollouts), tuple(tuple(c) for c in classes),
                     tuple(offsets) if offsets is not None else zeros,
                     tuple(train_offsets) if train_offsets is not None else zeros,
                     round(cost, 6), tuple(sorted(nodes.items())))


# ----- options ------------------------------------------------------------------------------
def phase_options(model: PlanningModel, job: JobSpec, kind: str) -> list[PhaseOption]:
    topo = model.topology
    phase = job.phase(kind)
    out = []
    for gpu_type in phase.gpu_types:
        for cluster in topo.clusters.values():
            if cluster.gpu_type != gpu_type:
                continue
            node_id = f"{cluster.name}-000"
            for gpus in sorted(set(phase.gpu_options)):
                nodes = math.ceil(gpus / cluster.gpus_per_node)
                if nodes > cluster.nodes or phase.host_mem_gb > cluster.host_mem_gb:
                    continue
                out.append(PhaseOption(gpus, gpu_type, cluster.name, nodes,
                                       ceil_ms(model.duration(job, kind, gpus, gpu_type)),
                                       ceil_ms(model.switch_s(job, kind, node_id)), phase.host_mem_gb))
    return out


def sync_estimate(model: PlanningModel, job: JobSpec, train: PhaseOption, rollout: PhaseOption) -> float:
    """Sync time between representative GPU sets of the two options (the time depends only on shape)."""
    topo = model.topology
    train_gpus = _first_gpus(topo, train.cluster, train.gpus, skip_nodes=0)
    skip = train.nodes if train.cluster == rollout.cluster else 0
    rollout_gpus = _first_gpus(topo, rollout.cluster, rollout.gpus, skip_nodes=skip)
    if not rollout_gpus:
        rollout_gpus = _first_gpus(topo, rollout.cluster, rollout.gpus, skip_nodes=0)
    return ceil_ms(model.sync_s(job, train_gpus, rollout_gpus))


def own_loop_s(model: PlanningModel, job: JobSpec, train: PhaseOption, rollout: PhaseOption) -> float:
    """The job's own loop per cycle on these options (rollout, train and sync, over its staleness):
    no cycle of a group holding it is shorter (rule 1 of planner/rules.py)."""
    return (rollout.duration_s + train.duration_s + sync_estimate(model, job, train, rollout)) / (1 + job.max_staleness)


def _first_gpus(topo: Topology, cluster: str, count: int, skip_nodes: int) -> list[str]:
    """The first ``count`` GPUs of the cluster's nodes after the first ``skip_nodes`` ([] if too few)."""
    gpus: list[str] = []
    for node in topo.nodes_in(cluster=cluster)[skip_nodes:]:  # only as many nodes as it takes
        if len(gpus) >= count:
            break
        gpus.extend(node.gpu_ids)
    return gpus[:count] if len(gpus) >= count else []


# ----- candidate enumeration ----------------------------------------------------------------------
def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


class CandidateBuilder:
    """Enumerates load-feasible candidate groups (see the module docstring)."""

    def __init__(self, model: PlanningModel, job_ids: list[int], max_group_size: int,
                 max_configs_per_set: int = 6, max_rollout_combos: int = 64,
                 budget: int | None = None, deadline: float | None = None):
        self.model = model
        self.jobs = model.jobs.jobs
        self.job_ids = job_ids
        self.k = max_group_size
        self.max_configs = max_configs_per_set
        self.max_combos = max_rollout_combos
        self.complete = True
        self.budget = budget  # most candidates to enumerate before giving up (EnumerationBudget)
        self.deadline = deadline  # time.perf_counter() value
        self.reserve: dict[tuple[int, ...], list[Candidate]] = {}
        self._loops: dict[tuple, tuple] = {}
        self.laid_out: dict = {}  # exact pricing's layouts by cap, kept across its passes (pricing.py)
        self.topo = model.topology
        self.train_opts = {j: phase_options(model, self.jobs[j], "train") for j in job_ids}
        self.rollout_opts = {j: phase_options(model, self.jobs[j], "rollout") for j in job_ids}
        self.cap = {j: member_cap(model, self.jobs[j]) for j in job_ids}
        self.widest: dict[str, int] = {}
        for t in (t for j in job_ids for t in self.train_opts[j]):
            self.widest[t.cluster] = max(t.nodes, self.widest.get(t.cluster, 1))
        self.price = self.topo.cluster_node_usd_per_hour()

    def loop_s(self, j: int, train: PhaseOption, rollout: PhaseOption) -> float:
        """Job ``j``'s own loop (rollout, train, sync) per cycle on these options (cached: pricing asks often)."""
        # Keyed by identity: hashing the option dataclasses was a third of the pricing time. The
        # cache holds the options themselves, so their ids stay unique while their entries live.
        key = (j, id(train), id(rollout))
        hit = self._loops.get(key)
        if hit is None:
            hit = self._loops[key] = (train, rollout, own_loop_s(self.model, self.jobs[j], train, rollout))
        return hit[2]

    def build(self) -> list[Candidate]:
        out: list[Candidate] = []
        self._grow([], out)
        return out

    def hopeless(self) -> bool:
        """True when so many pairs of jobs may share a group that the enumeration would only run
        into its budget: column generation should start at once. Pairs over a fifth of the budget
        is the rule (measured on the BL/RH/TH/Mixed generators: every complete enumeration within
        5,000 candidates had at most 430 such pairs, every one that overran had 180 or more, and
        100 jobs have 1,500-2,000). Beyond 2,000 pairs, a fixed sample of 2,000 estimates it."""
        if self.budget is None:
            return False
        ids = self.job_ids
        pairs = [(a, b) for a in range(len(ids)) for b in range(a + 1, len(ids))]
        sample = pairs if len(pairs) <= 2000 else random.Random(0).sample(pairs, 2000)
        fit = sum(1 for a, b in sample if self._may_fit([ids[a], ids[b]]))
        return fit * len(pairs) / max(1, len(sample)) > self.budget // 5

    def _grow(self, members: list[int], out: list[Candidate]) -> None:
        start = self.job_ids.index(members[-1]) + 1 if members else 0
        for j in self.job_ids[start:]:
            group = members + [j]
            if not self._may_fit(group):
                continue
            configs = self._configs(group)
            out.extend(configs)
            if (self.budget is not None and len(out) > self.budget) or \
                    (self.deadline is not None and time.perf_counter() > self.deadline):
                raise EnumerationBudget(f"more than {len(out)} candidates")
            if len(group) < self.k:
                self._grow(group, out)

    def _may_fit(self, group: list[int]) -> bool:
        """Necessary conditions that only get harder as jobs are added (safe to prune on)."""
        cap = group_cap(self.cap[j] for j in group)
        if cap < TIME_TOL:
            return False
        shared = len(group) > 1
        # A pool's nodes carry its members' train time and host memory: per node on average at most
        # the cap and a node's memory, the pool no wider than the widest training option of its cluster.
        min_train = min_mem = 0.0
        for j in group:
            best_loop = min((self.loop_s(j, t, r) for t in self.train_opts[j] for r in self.rollout_opts[j]),
                            default=math.inf)
            if not fits_cap(best_loop, cap):
                return False
            min_train += min((load_s(t, shared) * self.pool_share(t) for t in self.train_opts[j]), default=math.inf)
            min_mem += min((t.host_mem_gb * self.pool_share(t) for t in self.train_opts[j]), default=math.inf)
        return fits_cap(min_train, cap) and fits_memory(min_mem, max(c.host_mem_gb for c in self.topo.clusters.values()))

    def uniform_pools(self) -> bool:
        """Every training option of a cluster has one GPU count, so no pool mixes members' widths
        (column generation then needs no pricing of mixed pools: planner/optimize.py)."""
        counts: dict[str, set[int]] = {}
        for t in (t for j in self.job_ids for t in self.train_opts[j]):
            counts.setdefault(t.cluster, set()).add(t.gpus)
        return all(len(c) == 1 for c in counts.values())

    def pool_share(self, train: PhaseOption) -> float:
        """The least share of a training pool's node-time (or memory) this option takes: its nodes
        over the widest training option of its cluster (which no pool exceeds)."""
        return train.nodes / self.widest[train.cluster]

    def _configs(self, group: list[int]) -> list[Candidate]:
        cap = group_cap(self.cap[j] for j in group)
        found: list[Candidate] = []
        pools = set.intersection(*[{t.cluster for t in self.train_opts[j]} for j in group])
        mem = self.topo.clusters
        for cluster in sorted(pools):
            # Each member's (train, rollout) pairs whose own loop fits the cap, on this pool's cluster.
            pairs = [[(t, r) for t in self.train_opts[j] if t.cluster == cluster for r in self.rollout_opts[j]
                      if fits_cap(self.loop_s(j, t, r), cap)] for j in group]
            combos = list(itertools.islice(itertools.product(*pairs), self.max_combos + 1))
            if len(combos) > self.max_combos:
                self.complete = False
                combos = combos[:self.max_combos]
            layouts: dict[tuple, tuple[int, ...] | None] = {}
            for combo in combos:
                trains = tuple(t for t, _ in combo)
                if trains not in layouts:
                    layouts[trains] = class_layout(list(trains), cap, mem[cluster].host_mem_gb)
                if layouts[trains] is not None:
                    found.extend(self._rollout_classes(group, trains, layouts[trains],
                                                       tuple(r for _, r in combo), cap))
        found.sort(key=lambda c: c.cost)
        # Only the cheapest few go to the master; the rest wait in reserve and come in one by one when
        # a kept one turns out to have no timetable, so no feasible configuration is ever lost.
        if len(found) > self.max_configs:
            self.reserve[tuple(group)] = found[self.max_configs:]
        return found[:self.max_configs]

    def _rollout_classes(self, group: list[int], trains: tuple[PhaseOption, ...], train_offsets: tuple[int, ...],
                         rollouts: tuple[PhaseOption, ...], cap: float) -> list[Candidate]:
        out = []
        pool = max(t.nodes for t in trains)
        for part in set_partitions(list(range(len(group)))):
            nodes: dict[str, int] = {trains[0].cluster: pool}
            offsets: dict[int, int] = {}
            ok = True
            for cls in part:
                opts = [rollouts[i] for i in cls]
                if len({o.cluster for o in opts}) > 1:
                    ok = False
                    break
                layout = class_layout(opts, cap, self.topo.clusters[opts[0].cluster].host_mem_gb)
                if layout is None:
                    ok = False
                    break
                offsets.update(zip(cls, layout))
                nodes[opts[0].cluster] = nodes.get(opts[0].cluster, 0) + max(o.nodes for o in opts)
            if not ok:
                continue
            if any(n > self.topo.clusters[c].nodes for c, n in nodes.items()):
                continue
            out.append(make_candidate(self, group, list(trains), list(rollouts), [list(c) for c in part],
                                      [offsets[i] for i in range(len(group))], list(train_offsets)))
        return out


# ----- decoding -----------------------------------------------------------------------------
def candidate_members(model: PlanningModel, cand: Candidate, alloc) -> tuple[list[Member], list[str]]:
    topo = model.topology
    pool = cand.pool
    train_nodes = alloc.claim(pool.cluster, pool.nodes)
    train_gpus = {}
    for i, (train, first) in enumerate(zip(cand.trains, cand.train_offsets)):
        train_gpus[i] = [g for n in train_nodes[first:] for g in topo.node(n).gpu_ids][:train.gpus]
    nodes = list(train_nodes)
    rollout_gpus: dict[int, list[str]] = {}
    for cls in cand.classes:
        opts = [cand.rollouts[i] for i in cls]
        cls_nodes = alloc.claim(opts[0].cluster, max(o.nodes for o in opts))
        nodes += cls_nodes
        for i in cls:
            first = cand.offsets[i]
            pool = [g for n in cls_nodes[first:] for g in topo.node(n).gpu_ids]
            rollout_gpus[i] = pool[:cand.rollouts[i].gpus]
    jobs = model.jobs.jobs
    members = [Member(jobs[j], tuple(rollout_gpus[i]), tuple(train_gpus[i])) for i, j in enumerate(cand.jobs)]
    return members, nodes


def group_plan(model: PlanningModel, name: str, members: list[Member], nodes: list[str], tt: Timetable) -> GroupPlan:
    """The group's plan under the timetable ``tt``."""
    return roundrobin.group_plan(model.topology, name, members, tt.phases, tt.cycle_s, nodes, model.solo_of)


def work_lower_bound(model: PlanningModel, job_ids: list[int]) -> float:
    """Every job keeps its cheapest rollout and train GPUs busy for r and t seconds per cycle of at
    most slo * solo; $/h can be no lower than that busy share of their price. Colocated, the rollout
    runs on the training GPUs instead (planner/colocated.py): its busy share counts at their price."""
    total = 0.0
    topo = model.topology
    for j in job_ids:
        job = model.jobs.jobs[j]
        cap = member_cap(model, job)
        best = math.inf
        for kind_pair in itertools.product(phase_options(model, job, "rollout"), phase_options(model, job, "train")):
            r, t = kind_pair
            usd = (r.duration_s * r.gpus * topo.gpu_types[r.gpu_type].usd_per_hour
                   + t.duration_s * t.gpus * topo.gpu_types[t.gpu_type].usd_per_hour) / cap
            best = min(best, usd)
        for c in colocated_options(model, job):
            busy = sum(c.group.jobs[0].phase(k).duration_s for k in ("rollout", "train"))
            best = min(best, busy * c.gpus * topo.gpu_types[c.gpu_type].usd_per_hour / cap)
        total += best if best < math.inf else 0.0
    return total


def colocated_costs(model: PlanningModel, job_ids: list[int], max_group_size: int) -> dict[int, float]:
    """For the jobs that have a colocated group: the least $/h a plan can charge them on nodes of
    their own, their cheapest colocated group's or their least share of a pool they may time-share
    with other jobs (planner/colocated.py): a plan's colocated groups and pools cost at least the
    sum of their members' charges."""
    jobs = model.jobs.jobs
    shares = shared_pools(model, [jobs[j] for j in job_ids], max_group_size).share
    out = {}
    for j in job_ids:
        options = colocated_options(model, jobs[j])
        if options:
            out[j] = min(options[0].cost, shares.get(jobs[j].name, math.inf))
    return out


def packing_lower_bound(model: PlanningModel, job_ids: list[int], max_group_size: int) -> float:
    """The packing bound of both halves, each job charged the least of its two halves' charges and
    its colocated charge (``colocated_costs``): colocated jobs and pools hold nodes of their own,
    outside the halves' bins (whose per-node argument then holds for every other node)."""
    charges = _packing_charges(model, job_ids, max_group_size)
    if charges is None:
        return 0.0
    colocated = colocated_costs(model, job_ids, max_group_size)
    return sum(min(charges["rollout"].get(j, 0.0) + charges["train"].get(j, 0.0), colocated.get(j, math.inf))
               for j in job_ids)


def _packing_charges(model: PlanningModel, job_ids: list[int], max_group_size: int) -> dict[str, dict[int, float]] | None:
    """A bin-packing bound per kind of phase (their sum bounds a plan's cost), tighter than the work bound when phases are long against their caps.

    Each node of a plan hosts the phases of one group only, every phase once per cycle and the cycle
    within each member's cap ``slo * solo``, so on a node the shares ``x_j = duration_j / cap_j`` sum
    to at most one, and at most ``max_group_size`` jobs use it. For any dual feasible function ``f``
    (``sum x <= 1`` implies ``sum f(x) <= 1``) and ``lam`` in [0, 1], the charge
    ``lam / k + (1 - lam) f(x_j)`` per node a job uses therefore sums to at most one per node: the
    plan costs at least the sum over jobs of their cheapest charge in $/h. ``f`` ranges over
    Martello and Toth's ``U^eps`` (1 above 1 - eps, 0 below eps, x between) and Fekete and
    Schepers' ``u^(q)``. Valid only when no node can host both kinds of phase (rollout and training
    options on disjoint clusters); otherwise None. Returns each job's charge per kind at the
    function and ``lam`` that bound that kind best."""
    jobs = model.jobs.jobs
    topo = model.topology
    options = {kind: {j: phase_options(model, jobs[j], kind) for j in job_ids} for kind in ("rollout", "train")}
    clusters = {kind: {o.cluster for opts in by_job.values() for o in opts} for kind, by_job in options.items()}
    if not job_ids or clusters["rollout"] & clusters["train"]:
        return None
    price = topo.cluster_node_usd_per_hour()
    functions = [lambda x, e=e / 100: 1.0 if x > 1 - e else (x if x >= e else 0.0) for e in range(0, 51)]
    functions += [lambda x, q=q: x if abs((q + 1) * x - round((q + 1) * x)) < 1e-12 else math.floor((q + 1) * x) / q
                  for q in range(1, 11)]
    charges = {}
    for kind, by_job in options.items():
        items = {}
        for j, opts in by_job.items():
            cap = member_cap(model, jobs[j])
            if opts:
                items[j] = [(price[o.cluster] * o.nodes, min(1.0, max(0.0, (o.duration_s - 1e-3) / cap)))
                            for o in opts]
        best, best_charges = 0.0, {}
        for f in functions:
            shares = {j: [(usd, f(x)) for usd, x in opts] for j, opts in items.items()}
            for lam in (0.0, 0.25, 0.5, 0.75, 1.0):
                per_job = {j: min(usd * (lam / max_group_size + (1 - lam) * fx) for usd, fx in opts)
                           for j, opts in shares.items()}
                value = sum(per_job.values())
                if value > best:
                    best, best_charges = value, per_job
        charges[kind] = best_charges
    return charges


class NoPlanInTime(RuntimeError):
    """No plan verified within the time limit; ``fallback`` is the weave plan when one was made."""

    def __init__(self, message: str, fallback=None, bound: float | None = None):
        super().__init__(message)
        self.fallback = fallback
        self.bound = bound  # a lower bound valid for the model, when one was proved before time ran out


class EnumerationBudget(RuntimeError):
    """Too many candidate groups to enumerate within the budget."""


def inadmissible(model: PlanningModel, job: JobSpec) -> str | None:
    """Why no plan can place ``job``, whatever else it holds (None: some plan may): the rule every
    policy rejects by before it places anything."""
    from weave_rl.planner.fit import job_fit_problems

    if job.slo < 1:
        return f"SLO {job.slo:g} < 1: no placement runs a job faster than alone"
    problems = job_fit_problems(JobSet(jobs=(job,)), model.topology)
    if problems:
        return problems[0].reason
    if not phase_options(model, job, "rollout") or not phase_options(model, job, "train"):
        return "no GPU option fits a cluster of the topology"
    try:
        model.solo_of(job)
    except ValueError as exc:
        return str(exc)
    return None


def _admissible(model: PlanningModel) -> tuple[list[Rejection], list[int]]:
    """The jobs some plan may place (their indices), and the others rejected with the reason."""
    rejected, ok = [], []
    for j, job in enumerate(model.jobs.jobs):
        reason = inadmissible(model, job)
        if reason is None:
            ok.append(j)
        else:
            rejected.append(Rejection(name=job.name, reason=reason))
    return rejected, ok
