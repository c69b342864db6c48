"""The ``sim`` backend: a discrete-event model of the cluster under the controller.

Model (all times in seconds):

- Durations. When a phase is permitted, its duration ``D`` on its planned GPUs is drawn once from
  the job's profile (``Duration.sample`` with the run's seeded ``numpy`` Generator), moved to the
  planned GPU count and type by the profile's scaling rule (``PhaseSpec.duration_at``), and
  multiplied by the injected drift factor, if any. Scalar profiles give deterministic runs.
- Warm switch. A GPU that last held another (job, role) loads the job's per-GPU state from host
  memory first: ``host_mem_gb / gpus_per_node`` over PCIe (``Topology.warm_switch_s``), as the
  planner assumes. A GPU that already holds the state starts at once.
- Train phases are gangs: compute starts when every GPU is loaded and the controller permits it,
  and takes ``D``.
- Rollouts (elastic runs) progress as a fluid. The *bulk* -- the first ``threshold`` share of the
  responses -- is ``(1 - tail_share) * D`` of work, done at rate ``sum(speed) / planned GPUs``
  (``speed`` 1 on the planned GPU type, the ``hbm_tbps`` ratio on another type), so a rollout on
  half its GPUs runs at half speed; a lent GPU (one not among the planned) adds ``lend_gain * speed``
  (a loan joins mid-rollout, takes whole prompt groups and may have one taken back: 1 is the
  proportional ideal). The *tail* -- the long responses -- is ``tail_share * D`` of work and is
  latency-bound: it runs at rate 1 on its planned GPUs (or more) and at ``1 / tail_slowdown`` on
  fewer (after long-tail migration), whatever the count. Without migration or lending a rollout
  therefore takes exactly ``D``. ``tail_share``, ``tail_slowdown`` and ``lend_gain`` are assumptions
  (defaults below) unless fitted from real records (``profiles/elastic_fit.py``), per job in
  ``SimModel.jobs``. An elastic rollout's record carries the columns a real backend writes where the
  fluid model has them: ``shares``, ``tail_share`` (the job's), ``gpus_peak``, ``shares_taken_back``
  and ``wasted_gpu_s`` (0: a fluid wastes nothing).
- Weight sync follows the topology's two-stage model (``Topology.sync_time_s``). The part that
  crosses an inter-cluster link (one model copy at the bottleneck bandwidth of the two node sets)
  is a flow: concurrent syncs over the same link split its capacity evenly (``link_policy="fair"``)
  or by the controller's transfer schedule, earliest deadline first (``"deadline"``), recomputed
  whenever a transfer starts or ends (each flow also stays under its own bottleneck). The rest (latency,
  all-gather among receivers, NVLink broadcast) is a fixed delay after the crossing. Links inside a
  cluster are not shared in this model.
- Faults: ``node_down`` at ``t`` for ``d`` seconds; the GPUs of that node lose their loaded state.
"""

from __future__ import annotations

from functools import lru_cache
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import networkx as nx
import numpy as np

from weave_rl.executor.backend import Callbacks, Measured, PhaseRun, SyncRun
from weave_rl.executor.events import EventQueue, Timer
from weave_rl.planner.model import PlanningModel
from weave_rl.profiles.elastic_fit import ElasticParams
from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import Topology, node_of, switch_of

_node_of = lru_cache(maxsize=None)(node_of)  # GPU id -> node, called in every hot path

DriftFn = Callable[[str, str, float], float]  # (job, phase, time) -> duration factor
LINK_POLICIES = ("fair", "deadline")


@dataclass(frozen=True)
class SimModel:
    tail_share: float = 0.3  # share of a rollout's time after the threshold share of responses is done
    tail_slowdown: float = 1.05  # the tail on fewer GPUs than planned
    # Share of a lent GPU's speed that becomes bulk progress. 1.0, the proportional ideal, stays the
    # default: no GPU measurement is at hand to replace it, and the CPU runs that fit it share a core
    # between the lender and the borrower (a gain near 0 there says nothing about GPUs). Fit it.
    lend_gain: float = 1.0
    jobs: Mapping[str, ElasticParams] = field(default_factory=dict, hash=False)  # fitted per job
    link_sharing: bool = True
    # How concurrent syncs share a link: "fair" (even split, what uncoordinated TCP flows get) or
    # "deadline" (the controller's transfer schedule: earliest deadline first, each flow takes what
    # is left up to its own bottleneck; chunked transfers paced by the controller do this).
    link_policy: str = "deadline"

    def __post_init__(self) -> None:
        if self.link_policy not in LINK_POLICIES:
            raise ValueError(f"link_policy must be one of {', '.join(LINK_POLICIES)}, got {self.link_policy!r}")
        for where, params in [("", self.default), *((f"job {j}: ", p) for j, p in self.jobs.items())]:
            bad = params.problems()
            if bad:
                raise ValueError(f"{where}{bad[0][0]}: {bad[0][1]}")

    @property
    def default(self) -> ElasticParams:
        return ElasticParams(self.tail_share, self.tail_slowdown, self.lend_gain)

    def params(self, job: str) -> ElasticParams:
        return self.jobs.get(job) or self.default


@dataclass(frozen=True)
class Fault:
    node: str
    at_s: float
    for_s: float


@dataclass(eq=False)
class _Exec:
    run: PhaseRun
    ready: dict[str, float] = field(default_factory=dict)  # GPU -> time its warm switch ends
    switch_s: float = 0.0
    switch_gpu_s: float = 0.0
    duration: float = 0.0  # D on the planned GPUs
    stage: str = "wait"  # wait | bulk | tail | gang
    work: float = 0.0
    rate: float = 0.0
    last: float = 0.0
    started: float | None = None
    gpus_at_start: int = 0
    gpus_peak: int = 0
    busy_gpu_s: float = 0.0
    active: int = 0
    params: ElasticParams = ElasticParams()
    timer: Timer | None = None
    ready_timers: list[Timer] = field(default_factory=list)


@dataclass(eq=False)
class _Flow:
    run: SyncRun
    start: float
    bits: float  # left to cross the shared link
    cap_gbps: float  # own bottleneck
    links: tuple[tuple[str, str], ...]
    fixed_s: float
    rate_gbps: float = 0.0
    last: float = 0.0
    timer: Timer | None = None


class SimBackend:
    """Discrete-event backend; ``drift`` scales sampled durations, ``faults`` take nodes down."""

    def __init__(self, topology: Topology, jobs: JobSet, *, seed: int = 0, model: SimModel | None = None,
                 drift: DriftFn | None = None, faults: Sequence[Fault] = (), quantile: float | str = 0.95):
        self.topology = topology
        self.specs: dict[str, JobSpec] = {j.name: j for j in jobs.jobs}
        self.model = model or SimModel()
        self.rng = np.random.default_rng(seed)
        self.drift = drift
        self.events = EventQueue()
        self.planning = PlanningModel(topology, jobs, quantile)
        self.resident: dict[str, tuple[str, str]] = {}  # GPU -> (job, role) loaded on it
        self.execs: dict[PhaseRun, _Exec] = {}
        self.flows: dict[SyncRun, _Flow] = {}
        self.pending_fixed: dict[SyncRun, Timer] = {}
        self.on_link: dict[tuple[str, str], set[_Flow]] = {}
        self._factor_cache: dict[tuple, float] = {}
        self._links_cache: dict[tuple, tuple] = {}
        self._switch_cache: dict[tuple[str, str, str], float] = {}
        self._type_cache: dict[str, str] = {}
        self._sync_cache: dict[tuple, tuple] = {}
        self.controller: Callbacks | None = None
        self.faults = list(faults)

    # ----- Backend protocol -------------------------------------------------------------------
    def attach(self, controller: Callbacks) -> None:
        self.controller = controller
        for f in self.faults:
            self.topology.node(f.node)
            self.events.at(f.at_s, lambda n=f.node: self._down(n))
            self.events.at(f.at_s + f.for_s, lambda n=f.node: self.controller.node_up(n))

    def add_job(self, spec: JobSpec) -> None:
        self.specs[spec.name] = spec

    def start(self) -> None:
        """Nothing to start: the simulated clock begins at 0 (the Backend lifecycle)."""

    def stop(self) -> None:
        """Nothing to stop."""

    def now(self) -> float:
        return self.events.now

    def call_at(self, time: float, fn: Callable[[], None]) -> None:
        self.events.at(time, fn)

    def step(self) -> bool:
        return self.events.step()

    def idle(self) -> bool:
        return self.events.peek_time() is None

    def warm(self, run: PhaseRun, gpus: Sequence[str]) -> None:
        ex = self.execs.get(run)
        if ex is None:
            ex = self.execs[run] = _Exec(run, last=self.now())
        now = self.now()
        spec = self.specs[run.job]
        role = (run.job, run.phase)
        worst = 0.0
        for g in gpus:
            switch = 0.0
            if self.resident.get(g) != role:
                switch = self._switch_s(spec, run.phase, _node_of(g))
                self.resident[g] = role
            worst = max(worst, switch)
            ex.switch_gpu_s += switch
            ex.ready[g] = now + switch
            if switch > 0 and ex.stage in ("bulk", "tail"):
                ex.ready_timers.append(self.events.at(now + switch, lambda e=ex: self._reflow(e)))
        if ex.stage == "wait":
            ex.switch_s = max(ex.switch_s, worst)
        self._reflow(ex)

    def permit(self, run: PhaseRun) -> None:
        ex = self.execs[run]
        spec = self.specs[run.job]
        phase = spec.phase(run.phase)
        d = phase.duration_s.sample(self.rng) * self._factor(spec, run.phase, len(run.gpus), run.gpu_type)
        if self.drift is not None:
            d *= self.drift(run.job, run.phase, self.now())
        ex.duration = d
        if run.elastic:
            ex.stage = "bulk"
            ex.params = self.model.params(run.job)
            ex.work = d * (1.0 - ex.params.tail_share)
            for g, t in ex.ready.items():
                if t > self.now():
                    ex.ready_timers.append(self.events.at(t, lambda e=ex: self._reflow(e)))
            self._reflow(ex)
        else:
            ex.stage = "gang"
            start = max([self.now(), *ex.ready.values()])
            ex.started = start
            ex.gpus_at_start = len(ex.ready)
            run.started_s = start
            ex.busy_gpu_s = len(ex.ready) * d
            ex.timer = self.events.at(start + d, lambda e=ex: self._finish(e))

    def release(self, run: PhaseRun, gpus: Sequence[str], *, tail: bool = False) -> None:
        ex = self.execs.get(run)
        if ex is None:
            return
        self._progress(ex)
        for g in gpus:
            ex.ready.pop(g, None)
        self._reflow(ex)

    def abort(self, run: PhaseRun | SyncRun) -> None:
        if isinstance(run, SyncRun):
            flow = self.flows.pop(run, None)
            if flow is not None:
                if flow.timer:
                    flow.timer.cancel()
                self._unlink(flow)
            fixed = self.pending_fixed.pop(run, None)
            if fixed is not None:
                fixed.cancel()
            return
        ex = self.execs.pop(run, None)
        if ex is None:
            return
        for t in [ex.timer, *ex.ready_timers]:
            if t is not None:
                t.cancel()

    def start_sync(self, run: SyncRun) -> None:
        spec = self.specs[run.job]
        key = (run.job, run.train_gpus, run.rollout_gpus)
        if key not in self._sync_cache:
            total = self.planning.sync_s(spec, list(run.train_gpus), list(run.rollout_gpus))
            src = sorted({_node_of(g) for g in run.train_gpus})
            remote = sorted({_node_of(g) for g in run.rollout_gpus} - set(src))
            links = self._links(src, remote) if remote else ()
            gbps = self.topology.bottleneck_gbps(src, remote) if remote else float("inf")
            self._sync_cache[key] = (total, links, gbps)
        total, links, gbps = self._sync_cache[key]
        bits = spec.weight_bytes * 8
        if not links or not self.model.link_sharing or total <= 0:
            self.pending_fixed[run] = self.events.after(total, lambda r=run, s=self.now(): self._sync_end(r, s))
            return
        cross = bits / (gbps * 1e9)
        flow = _Flow(run, self.now(), bits, gbps, links, max(0.0, total - cross), last=self.now())
        self.flows[run] = flow
        self._reshare(links)  # bring the others up to date at their old rates
        for link in links:
            self.on_link.setdefault(link, set()).add(flow)
        self._reshare(links)

    # ----- faults -----------------------------------------------------------------------------
    def _down(self, node: str) -> None:
        for g in self.topology.node(node).gpu_ids:
            self.resident.pop(g, None)
        self.controller.node_down(node)

    # ----- phases -----------------------------------------------------------------------------
    def _switch_s(self, spec: JobSpec, kind: str, node: str) -> float:
        key = (spec.name, kind, node)
        value = self._switch_cache.get(key)
        if value is None:
            value = self._switch_cache[key] = self.planning.switch_s(spec, kind, node)
        return value

    def _factor(self, spec: JobSpec, kind: str, gpus: int, gpu_type: str) -> float:
        key = (spec.name, kind, gpus, gpu_type, id(spec))
        f = self._factor_cache.get(key)
        if f is None:
            phase = spec.phase(kind)
            ref = phase.duration_s.quantile(0.5)
            f = phase.duration_at(0.5, gpus, gpu_type, self.topology.gpu_types) / ref
            self._factor_cache[key] = f
        return f

    def _speed(self, ex: _Exec, gpu: str) -> float:
        t = self._type_cache.get(gpu)
        if t is None:
            t = self._type_cache[gpu] = self.topology.gpu_type_of(gpu)
        if t == ex.run.gpu_type:
            return 1.0
        cat = self.topology.gpu_types
        return cat[t].hbm_tbps / cat[ex.run.gpu_type].hbm_tbps

    def _progress(self, ex: _Exec) -> None:
        now = self.now()
        if ex.stage in ("bulk", "tail"):
            dt = now - ex.last
            ex.work -= ex.rate * dt
            ex.busy_gpu_s += ex.active * dt
        ex.last = now

    def _reflow(self, ex: _Exec) -> None:
        """Recompute an elastic rollout's rate after its GPUs or stage changed; reschedule its end."""
        if ex.stage not in ("bulk", "tail") or self.execs.get(ex.run) is not ex:
            return
        self._progress(ex)
        now = self.now()
        active = [g for g, t in ex.ready.items() if t <= now + 1e-12]
        ex.active = len(active)
        ex.gpus_peak = max(ex.gpus_peak, ex.active)
        planned = len(ex.run.gpus)
        if ex.stage == "bulk":
            own = set(ex.run.gpus)
            gain = ex.params.lend_gain
            ex.rate = sum(self._speed(ex, g) * (1.0 if g in own else gain) for g in active) / planned
        else:
            ex.rate = 0.0 if not active else (1.0 if len(active) >= planned else 1.0 / ex.params.tail_slowdown)
        if ex.rate > 0 and ex.started is None:
            ex.started = now
            ex.gpus_at_start = len(active)
            ex.run.started_s = now
        if ex.timer is not None:
            ex.timer.cancel()
            ex.timer = None
        if ex.rate > 0:
            ex.timer = self.events.at(now + max(ex.work, 0.0) / ex.rate, lambda e=ex: self._stage_end(e))

    def _stage_end(self, ex: _Exec) -> None:
        self._progress(ex)
        ex.timer = None
        if ex.stage == "bulk":
            ex.stage = "tail"
            ex.work = ex.duration * ex.params.tail_share
            self._reflow(ex)
            if ex.run.watch_threshold is not None:
                self.controller.threshold_reached(ex.run)
            return
        self._finish(ex)

    def _finish(self, ex: _Exec) -> None:
        if self.execs.get(ex.run) is not ex:
            return
        del self.execs[ex.run]
        for t in ex.ready_timers:
            t.cancel()
        run = ex.run
        now = self.now()
        start = ex.started if ex.started is not None else now
        extra = {}
        if run.elastic:  # the columns a real backend writes, for a column-by-column comparison
            extra = {"shares": run.shares, "tail_share": ex.params.tail_share, "gpus_peak": ex.gpus_peak,
                     "shares_taken_back": 0, "wasted_gpu_s": 0.0}
        m = Measured(start_s=start, end_s=now, switch_s=ex.switch_s, width_s=ex.duration,
                     gpus=ex.gpus_at_start or len(run.gpus), gpu_type=run.gpu_type, busy_gpu_s=ex.busy_gpu_s,
                     switch_gpu_s=ex.switch_gpu_s, cluster=self.topology.node(_node_of(run.gpus[0])).cluster,
                     extra=extra)
        self.controller.phase_done(run, m)

    # ----- weight sync ------------------------------------------------------------------------
    def _links(self, src: list[str], dst: list[str]) -> tuple[tuple[str, str], ...]:
        """Inter-cluster links on the switch-level path from the sources' to the receivers' clusters."""
        sc = tuple(sorted({self.topology.node(n).cluster for n in src}))
        dc = tuple(sorted({self.topology.node(n).cluster for n in dst}))
        key = (sc, dc)
        if key not in self._links_cache:
            links: set[tuple[str, str]] = set()
            switches = self.topology.graph.subgraph([switch_of(c) for c in self.topology.clusters])
            for a in sc:
                for b in dc:
                    if a == b:
                        continue
                    try:
                        path = nx.shortest_path(switches, switch_of(a), switch_of(b))
                    except nx.NetworkXNoPath:
                        continue
                    links.update(tuple(sorted(e)) for e in zip(path, path[1:]))
            self._links_cache[key] = tuple(sorted(links))
        return self._links_cache[key]

    def _reshare(self, links: Sequence[tuple[str, str]]) -> None:
        """Share of each link among its flows (``SimModel.link_policy``); every flow also respects
        its own bottleneck.

        Flows on the given links are brought up to date at their old rates first; a flow whose
        rate does not change keeps its end event.
        """
        found: set[_Flow] = set()
        todo, seen = list(links), set()
        while todo:  # every flow whose rate may change: those sharing a link, transitively
            link = todo.pop()
            if link in seen:
                continue
            seen.add(link)
            for f in self.on_link.get(link, set()):
                found.add(f)
                if self.model.link_policy != "fair":  # an even split depends only on each link's count
                    todo.extend(f.links)
        flows = sorted(found, key=lambda f: (f.start, f.run.job, f.run.iteration))  # deterministic order
        now = self.now()
        for f in flows:
            f.bits -= f.rate_gbps * 1e9 * (now - f.last)
            f.last = now
        capacity = self.topology.graph.edges
        if self.model.link_policy == "deadline":
            left = {link: capacity[link]["capacity"] for f in flows for link in f.links}
            rates = {}
            for f in sorted(flows, key=lambda f: (f.run.deadline_s, f.start, f.run.job, f.run.iteration)):
                rates[f] = max(0.0, min(f.cap_gbps, min(left[link] for link in f.links)))
                for link in f.links:
                    left[link] -= rates[f]
        else:
            rates = {f: min(f.cap_gbps, min(capacity[link]["capacity"] / len(self.on_link[link]) for link in f.links))
                     for f in flows}
        for f in flows:
            rate = rates[f]
            if rate == f.rate_gbps and f.timer is not None and f.timer.active:
                continue
            f.rate_gbps = rate
            if f.timer is not None:
                f.timer.cancel()
                f.timer = None
            if rate > 0:  # a flow with no share left waits for the next reshare
                f.timer = self.events.at(now + max(f.bits, 0.0) / (rate * 1e9), lambda fl=f: self._cross_end(fl))

    def _unlink(self, flow: _Flow) -> None:
        self._reshare(flow.links)  # bring the link's flows up to date while the flow still counts
        for link in flow.links:
            self.on_link.get(link, set()).discard(flow)
        self._reshare(flow.links)

    def _cross_end(self, flow: _Flow) -> None:
        if self.flows.get(flow.run) is not flow:
            return
        del self.flows[flow.run]
        flow.timer = None
        self._unlink(flow)
        self.pending_fixed[flow.run] = self.events.after(flow.fixed_s, lambda: self._sync_end(flow.run, flow.start))

    def _sync_end(self, run: SyncRun, start: float) -> None:
        self.pending_fixed.pop(run, None)
        now = self.now()
        m = Measured(start_s=start, end_s=now, switch_s=0.0, width_s=now - start, gpus=len(run.rollout_gpus),
                     gpu_type=self.topology.gpu_type_of(run.rollout_gpus[0]),
                     cluster=self.topology.node(_node_of(run.rollout_gpus[0])).cluster)
        self.controller.sync_done(run, m)
