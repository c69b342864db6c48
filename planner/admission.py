"""Admission on a live plan: admit an arriving job, release a finished one, without a new solve.

``AdmissionPlanner`` keeps a plan live (planner/live.py: groups with their members' GPUs and
timetables, free nodes, host memory per node) so that one admission costs a handful of checks per
group, not a new solve:

- ``admit(job)`` never moves a placed job. It tries, cheapest first: joining a group on rollout
  nodes it already holds or time-sharing a pool's GPUs (no added cost), joining a group on fresh
  rollout nodes, a new group of its own on fresh nodes (phases apart, or side by side on one node).
  It opens no colocated group (greedily, one would take nodes that later jobs could have shared
  phases apart), but joins one that a plan put in force. Groups are screened by necessary
  conditions (group size, training pool type and width, training busy time and host memory within
  every member's cap) before the round-robin timetable (planner/roundrobin.py) checks every
  member's SLO exactly, and as drawn (planner/drawn.py), on at most ``max_trials`` groups,
  best-fitting training pool first: admission latency stays bounded with thousands of jobs (a job
  that finds no room there gets a group of its own; a replan repacks).
- Admission also keeps each inter-cluster link's average sync load (one model copy per job per
  cycle, at the link's bandwidth) within ``link_budget`` (70 % by default): past it, concurrent syncs
  queue on the link and stretch iterations beyond their SLOs. A job that would overload it waits.
- ``release(name)`` drops a finished job; nodes nobody in its group uses any more go back to the
  free pool, and the group keeps its timetable unless the round robin of the rest is shorter.

The optimal planner uses it to place the jobs left over around verified groups; re-optimizing a
live plan (``planner/online.py``) sits above both, so imports run one way:
online -> optimize -> admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from weave_rl.planner.colocated import colocated_options
from weave_rl.planner.drawn import meets_slos_as_drawn
from weave_rl.planner.live import LiveGroup, LivePlan
from weave_rl.planner.model import PlanningModel, ceil_ms
from weave_rl.planner.rules import fits_memory, group_cap, meets_slo, member_cap
from weave_rl.planner.optimal import PhaseOption, inadmissible, phase_options
from weave_rl.planner.plan import DEFAULT_ELASTIC, Plan, Rejection, SolverInfo
from weave_rl.planner.roundrobin import Member, PhaseTime, round_robin_timetable
from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import Topology, node_of


@dataclass(frozen=True)
class Admission:
    placed: bool
    group: str | None
    reason: str | None
    plan: Plan
    added_usd_per_hour: float = 0.0


@dataclass
class _Screen:
    """A group's screening figures, refreshed on every change: training busy time, smallest cap, and
    per rollout node the rollout time (warm switches included) that runs there each cycle."""
    train_busy: float
    cap: float
    rollout_busy: dict[str, float]


@dataclass
class _Placement:
    added: float  # $/h
    group: LiveGroup | None  # None: a new group
    member: Member
    fresh: list[str]  # nodes taken from the free pool
    cycle_s: float
    phases: dict[str, dict[str, PhaseTime]] = field(default_factory=dict)


class AdmissionPlanner:
    def __init__(self, topology: Topology, jobs: JobSet, plan: Plan | None = None, *,
                 quantile: float | str = 0.95, max_group_size: int = 5, max_trials: int = 24,
                 link_budget: float | None = 0.7, source: str = "<plan>"):
        self.topology = topology
        self.max_group_size = max_group_size
        self.max_trials = max_trials  # round-robin simulations per admission, best-fitting groups first
        self._trials = max_trials
        # Share of each inter-cluster link that the weight syncs of admitted groups may use on average
        # (one model copy per job per cycle); above it, concurrent syncs queue on the link and stretch
        # iterations past their SLOs (the simulator shares link bandwidth). None: no limit.
        self.link_budget = link_budget
        self._links = {tuple(sorted(link.between)): link.gbps for link in topology.spec.links}
        self.quantile = plan.quantile if plan is not None else quantile
        self._full_link: tuple[str, str] | None = None
        self.reset(jobs, plan, source)

    def reset(self, jobs: JobSet, plan: Plan | None, source: str = "<plan>") -> None:
        """Forget the live state; hold ``plan`` (None: nothing placed) for ``jobs``."""
        self.jobs: dict[str, JobSpec] = {j.name: j for j in jobs.jobs}
        self.model = PlanningModel(self.topology, jobs, self.quantile)
        self.live = LivePlan(self.model)
        self.link_load: dict[tuple[str, str], float] = {}
        self._screens: dict[str, _Screen] = {}
        self._busy: dict[tuple, float] = {}
        self._options: dict[tuple, list[PhaseOption]] = {}
        if plan is not None:
            self.live.load(plan, self.jobs, source)
            for group in self.groups.values():
                self._summarize(group)
                self._add_load(self._group_load(group.members, group.cycle_s), +1)

    @property
    def groups(self) -> dict[str, LiveGroup]:
        return self.live.groups

    @property
    def plan(self) -> Plan:
        groups = self.live.group_plans()
        cost = round(sum(g.usd_per_hour or 0.0 for g in groups), 6)
        return Plan.model_construct(version=1, policy="online", objective="cost", quantile=self.quantile,
                                    topology=self.topology.name, cost_usd_per_hour=cost,
                                    lower_bound_usd_per_hour=None,
                                    solver=SolverInfo(name="online", status="FEASIBLE"),
                                    groups=groups, rejected=list(self.live.rejected), elastic=dict(DEFAULT_ELASTIC))

    # ----- screening figures -------------------------------------------------------------------
    def _cap(self, job: JobSpec) -> float:
        return member_cap(self.model, job)

    def _busy_s(self, job: JobSpec, kind: str, gpus: tuple[str, ...]) -> float:
        """The phase's duration plus its warm switch on these GPUs (cached by shape: the same for
        every node of a cluster)."""
        node = self.topology.node(node_of(gpus[0]))
        key = (job.name, kind, len(gpus), node.cluster)
        if key not in self._busy:
            self._busy[key] = (ceil_ms(self.model.duration(job, kind, len(gpus), node.gpu_type))
                               + ceil_ms(self.model.max_switch_s(job, kind, list(gpus))))
        return self._busy[key]

    def _summarize(self, group: LiveGroup) -> None:
        rollout_busy: dict[str, float] = {}
        for m in group.members:
            busy = self._busy_s(m.job, "rollout", m.rollout_gpus)
            for node in {node_of(g) for g in m.rollout_gpus}:
                rollout_busy[node] = rollout_busy.get(node, 0.0) + busy
        self._screens[group.name] = _Screen(sum(self._busy_s(m.job, "train", m.train_gpus) for m in group.members),
                                            group_cap(self._cap(m.job) for m in group.members), rollout_busy)

    # ----- admit -------------------------------------------------------------------------------
    def admit(self, job: JobSpec) -> Admission:
        """Place ``job`` without moving any placed job, at the least added $/h; reject it (with the
        reason, in ``plan.rejected``) when nothing fits."""
        if job.name in self.jobs and self.live.group_of(job.name) is not None:
            raise ValueError(f"job {job.name} is already placed")
        if self.jobs.get(job.name, job) is not job:  # same name, new profile: forget cached figures
            self._busy = {k: v for k, v in self._busy.items() if k[0] != job.name}
            self._options = {k: v for k, v in self._options.items() if k[0] != job.name}
            self.model._solo_cache.pop(job.name, None)
        self.jobs[job.name] = job
        self.live.rejected = [r for r in self.live.rejected if r.name != job.name]
        reason = inadmissible(self.model, job)
        best = None
        if reason is None:
            best, reason = self._best_placement(job)
        if best is None:
            self.live.rejected.append(Rejection(name=job.name, reason=reason or "no placement found"))
            return Admission(False, None, reason, self.plan)
        group = self._apply(best)
        return Admission(True, group.name, None, self.plan, round(best.added, 6))

    def _best_placement(self, job: JobSpec) -> tuple[_Placement | None, str | None]:
        cap = self._cap(job)
        scaled: list[_Placement] = []
        # Groups whose training pool is the tightest fit first (best fit keeps roomy pools for later).
        screened = []
        for group in self.groups.values():
            slack = self._screen(job, group, cap)
            if slack is not None:
                screened.append((slack, group.name, group))
        self._trials = self.max_trials
        for _, _, group in sorted(screened):
            if self._trials <= 0:
                break
            # One placement on fresh rollout nodes is enough: any other costs the same or more.
            for placement in self._join(job, group, fresh=not scaled):
                if placement.added == 0.0:
                    return placement, None
                scaled.append(placement)
                break
        alone = self._alone(job)
        options = scaled + ([alone] if isinstance(alone, _Placement) else [])
        if not options:
            return None, alone if isinstance(alone, str) else "no free nodes"
        return min(options, key=lambda p: (p.added, p.cycle_s)), None

    def _screen(self, job: JobSpec, group: LiveGroup, cap: float) -> float | None:
        """Necessary conditions to join ``group``; the training pool's slack when they hold."""
        if len(group.members) >= self.max_group_size:
            return None
        gpus = group.train_gpus
        if len(gpus) not in job.train.gpu_options or self.topology.gpu_type_of(gpus[0]) not in job.train.gpu_types:
            return None
        screen = self._screens[group.name]
        limit = min(screen.cap, cap)
        busy = screen.train_busy + self._busy_s(job, "train", gpus)
        if not meets_slo(busy, limit):
            return None
        if any(not fits_memory(self.live.memory.gb(n) + job.train.host_mem_gb, self.topology.node(n).host_mem_gb)
               for n in {node_of(g) for g in gpus}):  # every training node holds one more train state
            return None
        return limit - busy

    def _join(self, job: JobSpec, group: LiveGroup, fresh: bool = True):
        """Feasible placements in ``group``: time-sharing its GPUs when every member's rollout and
        train are on them (a pool), then on its rollout nodes, then (if ``fresh``) on fresh ones."""
        topo = self.topology
        pool = group.train_gpus
        if all(m.rollout_gpus == m.train_gpus == pool for m in group.members) \
                and any(c.cluster == topo.node(node_of(pool[0])).cluster and c.gpus == len(pool)
                        for c in colocated_options(self.model, job)):
            p = self._try(group, Member(job, pool, pool), [], 0.0)
            if p is not None:
                yield p
                return
        for option in self._phase_options(job, "rollout"):
            runs = self._runs(group.rollout_nodes, option)
            screen = self._screens[group.name]
            limit = min(screen.cap, self._cap(job))
            for run in runs:
                gpus = tuple(g for n in run for g in topo.node(n).gpu_ids)[:option.gpus]
                busy = self._busy_s(job, "rollout", gpus)
                if any(not meets_slo(screen.rollout_busy.get(n, 0.0) + busy, limit) for n in run):
                    continue  # that node cannot run one more rollout per cycle
                p = self._try(group, Member(job, gpus, group.train_gpus), [], 0.0)
                if p is not None:
                    yield p
                    return
        if not fresh:
            return
        for option in self._phase_options(job, "rollout"):
            nodes = self.live.alloc.peek(option.cluster, option.nodes)
            if nodes is None:
                continue
            gpus = tuple(g for n in nodes for g in topo.node(n).gpu_ids)[:option.gpus]
            p = self._try(group, Member(job, gpus, group.train_gpus), nodes, topo.cost_usd_per_hour(nodes))
            if p is not None:
                yield p
                return

    def _phase_options(self, job: JobSpec, kind: str) -> list[PhaseOption]:
        key = (job.name, kind)
        if key not in self._options:
            options = phase_options(self.model, job, kind)
            price = self.topology.cluster_node_usd_per_hour()
            self._options[key] = sorted(options, key=lambda o: (price[o.cluster] * o.nodes, o.gpus))
        return self._options[key]

    def _alone_on_one_node(self, job: JobSpec, t: PhaseOption, o: PhaseOption) -> _Placement | None:
        """A group of its own with both phases side by side on one free node (train on its first
        GPUs): what a one-node topology offers, and on any cluster maybe cheaper than two nodes."""
        topo = self.topology
        if t.cluster != o.cluster or t.nodes != 1 or o.nodes != 1 \
                or t.gpus + o.gpus > topo.clusters[t.cluster].gpus_per_node:
            return None
        node = self.live.alloc.peek(t.cluster, 1)
        if node is None:
            return None
        gpus = topo.node(node[0]).gpu_ids
        member = Member(job, tuple(gpus[t.gpus:t.gpus + o.gpus]), tuple(gpus[:t.gpus]))
        self._full_link = None
        return self._try(None, member, list(node), topo.cost_usd_per_hour(node))

    def _runs(self, nodes: list[str], option: PhaseOption) -> list[list[str]]:
        topo = self.topology
        same = [n for n in nodes if topo.node(n).cluster == option.cluster]
        return [same[i:i + option.nodes] for i in range(len(same) - option.nodes + 1)]

    # ----- inter-cluster links ----------------------------------------------------------------------
    def _group_load(self, members: list[Member], cycle_s: float) -> dict[tuple[str, str], float]:
        """Busy share of each inter-cluster link: one model copy per member per cycle crosses the
        link between its training and rollout clusters (the two-stage sync)."""
        load: dict[tuple[str, str], float] = {}
        for m in members:
            pair = tuple(sorted((self.topology.node(node_of(m.train_gpus[0])).cluster,
                                 self.topology.node(node_of(m.rollout_gpus[0])).cluster)))
            if pair[0] != pair[1] and pair in self._links:
                seconds = m.job.weight_bytes * 8 / (self._links[pair] * 1e9)
                load[pair] = load.get(pair, 0.0) + seconds / cycle_s
        return load

    def _add_load(self, load: dict[tuple[str, str], float], sign: int) -> None:
        for pair, share in load.items():
            self.link_load[pair] = self.link_load.get(pair, 0.0) + sign * share

    def _link_full(self, before: dict, after: dict) -> tuple[str, str] | None:
        if self.link_budget is None:
            return None
        for pair, share in after.items():
            if self.link_load.get(pair, 0.0) - before.get(pair, 0.0) + share > self.link_budget + 1e-9:
                return pair
        return None

    def _try(self, group: LiveGroup | None, member: Member, fresh: list[str], added: float) -> _Placement | None:
        if self.live.memory.overflow(member) is not None:
            return None
        if group is not None:
            self._trials -= 1
        members = (group.members if group else []) + [member]
        rr = round_robin_timetable(self.model, members)
        if any(not meets_slo(rr.cycle_s, self._cap(m.job)) for m in members) \
                or not meets_slos_as_drawn(self.model, members, rr.phases, rr.cycle_s):
            return None
        before = self._group_load(group.members, group.cycle_s) if group else {}
        full = self._link_full(before, self._group_load(members, rr.cycle_s))
        if full is not None:
            self._full_link = full
            return None
        return _Placement(added, group, member, fresh, rr.cycle_s, rr.phases)

    def _alone(self, job: JobSpec) -> _Placement | str:
        """The cheapest new group of its own, or the reason there is none."""
        topo = self.topology
        best: _Placement | str = "no free nodes for a group of its own"
        for t in self._phase_options(job, "train"):
            for o in self._phase_options(job, "rollout"):
                shared = self._alone_on_one_node(job, t, o)  # its failure leaves the reason to the others
                if shared is not None and (isinstance(best, str) or shared.added < best.added):
                    best = shared
                if t.cluster == o.cluster:
                    nodes = self.live.alloc.peek(t.cluster, t.nodes + o.nodes)
                    train_nodes, roll_nodes = (nodes[:t.nodes], nodes[t.nodes:]) if nodes else (None, None)
                else:
                    train_nodes, roll_nodes = (self.live.alloc.peek(t.cluster, t.nodes),
                                               self.live.alloc.peek(o.cluster, o.nodes))
                if train_nodes is None or roll_nodes is None:
                    continue
                member = Member(job, tuple(g for n in roll_nodes for g in topo.node(n).gpu_ids)[:o.gpus],
                                tuple(g for n in train_nodes for g in topo.node(n).gpu_ids)[:t.gpus])
                fresh = train_nodes + roll_nodes
                self._full_link = None
                p = self._try(None, member, fresh, topo.cost_usd_per_hour(fresh))
                if p is None:
                    if self._full_link is not None:
                        a, b = self._full_link
                        best = (f"the {a}-{b} link is full: weight syncs would use more than "
                                f"{100 * self.link_budget:.0f}% of it")
                    elif isinstance(best, str):
                        best = f"misses its SLO even alone on {t.gpus}+{o.gpus} GPUs"
                    continue
                if isinstance(best, str) or p.added < best.added:
                    best = p
        return best

    def _apply(self, p: _Placement) -> LiveGroup:
        if p.group is None:
            group = self.live.open(p.member, p.fresh, p.cycle_s, p.phases)
        else:
            group = p.group
            self._add_load(self._group_load(group.members, group.cycle_s), -1)
            self.live.join(group, p.member, p.fresh, p.cycle_s, p.phases)
        self._summarize(group)
        self._add_load(self._group_load(group.members, group.cycle_s), +1)
        return group

    # ----- release -----------------------------------------------------------------------------
    def release(self, name: str) -> Plan:
        """Free a finished (or cancelled) job; its group shrinks, or disappears with its last job."""
        group = self.live.group_of(name)
        if group is None:
            if any(r.name == name for r in self.live.rejected):
                self.live.rejected = [r for r in self.live.rejected if r.name != name]
                return self.plan
            raise KeyError(f"job {name} is not in the plan")
        self._add_load(self._group_load(group.members, group.cycle_s), -1)
        if self.live.release(name) is None:
            del self._screens[group.name]
        else:
            self._summarize(group)
            self._add_load(self._group_load(group.members, group.cycle_s), +1)
        return self.plan
