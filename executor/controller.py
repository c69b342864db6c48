"""The controller: applies a Plan through any backend (DESIGN 5).

It owns the scheduling decisions and nothing physical:

- per-GPU FIFO queues in the plan's order (``weave_rl.executor.queues``); a phase is *warmed* on its GPUs as
  soon as they are free and it heads their queues, and *permitted* once its inputs are ready
  (rollout k after sync k-1-max_staleness, train k after rollout k, sync k after train k): a
  work-conserving run in the plan's order, not a replay of clock times. Choice: a phase never waits
  for its planned offset. The plan's cycle is then an upper bound; a timetable with slack (a cycle
  longer than its critical loop of phases, switches and syncs) runs faster than planned. Every
  example plan in ``plans/`` is tight, and with deterministic durations the simulated iteration
  matches ``iteration_s`` to within 0.01% (``tests/test_sim_fidelity.py``). Pacing phases to their
  offsets would hide exactly the slack the elastic rules exist to reclaim;
- elastic rules (``weave_rl.executor.config.ElasticRules``): long-tail migration (at the threshold share of
  responses the rollout keeps ``target_share`` of its GPUs, the rest go to their next queued phase;
  a rollout may start on part of its GPUs and grow as the others free up) and lending (a GPU whose
  next phase waits for its inputs longer than ``lend_min_gain`` round-trip switches joins a running
  rollout of its group, and is taken back when its own phase is ready);
- faults: a node going down aborts the runs that hold its GPUs (a lent GPU is just withdrawn);
  their jobs restart the iteration after the last completed one, queued ahead of everything else on
  their GPUs, once the GPUs are there; other jobs and groups carry on;
- plan changes (replanning, admission, release): unchanged groups carry on; a job joining a group
  whose timetable is otherwise unchanged slots into the first cycle in which no member has started
  its rollout (members run ahead of their planned times when drawn short); any other change drains the
  groups involved (no new iteration starts, running ones finish: the cycle boundary) and then
  installs the new timetables, optionally after a migration delay;
- what happened: one record per finished phase (DESIGN 3.4 columns plus extras), iteration ends,
  restarts and plan switches, and the $/h and GPUs held over time.
"""

from __future__ import annotations

from functools import lru_cache
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

from weave_rl.executor.backend import Backend, Measured, PhaseRun, SyncRun
from weave_rl.executor.config import ElasticRules
from weave_rl.executor.queues import GpuQueue, JobSchedule, Key
from weave_rl.executor.switching import changed_jobs, hot_joins
from weave_rl.executor.switching import closure as affected
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.plan import GroupPlan, JobPlan, Plan
from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import Topology, node_of

_node_of = lru_cache(maxsize=None)(node_of)  # GPU id -> node, called in every hot path

PHASES = ("rollout", "train", "sync")


@dataclass
class JobState:
    spec: JobSpec
    total: int  # iterations to run (the job leaves after the last)
    done: dict[str, int] = field(default_factory=lambda: {p: -1 for p in PHASES})
    limit: int = 0  # iterations below this may start (lowered to drain the job)
    not_before: float = 0.0  # migration delay after a plan switch
    first_start: float | None = None
    finished_at: float | None = None
    rollout_starts: dict[int, float] = field(default_factory=dict)
    iteration_ends: dict[int, float] = field(default_factory=dict)
    restarts: int = 0
    # Rollout and train time as drawn, moved to the job's solo GPUs (its SLO reference): per
    # iteration until its sync ends, then summed over the finished iterations.
    solo_work_s: dict[int, float] = field(default_factory=dict)
    solo_work_done_s: float = 0.0

    @property
    def staleness(self) -> int:
        return self.spec.max_staleness

    @property
    def finished(self) -> bool:
        return self.done["sync"] >= self.total - 1


@dataclass(frozen=True)
class HeldGroup:
    name: str
    nodes: tuple[str, ...]
    usd_per_hour: float


@dataclass
class PendingSwitch:
    plan: Plan
    jobs: set[str]  # jobs of the new plan to (re)install once the draining ones are idle
    draining: set[str]
    delays: dict[str, float]
    reason: str


class Controller:
    def __init__(self, backend: Backend, plan: Plan, topology: Topology, jobs: JobSet, *,
                 iterations: int | None = None, rules: ElasticRules | None = None,
                 start_jobs: bool = True):
        self.backend = backend
        self.topology = topology
        self.jobs = jobs
        self.specs = {j.name: j for j in jobs.jobs}
        self.rules = rules if rules is not None else ElasticRules.from_plan(plan.elastic)
        self.model = PlanningModel(topology, jobs, plan.quantile)
        self.default_iterations = iterations
        self.plan = plan
        self.target = plan  # the latest plan asked for (it may still wait for a cycle boundary)
        self.schedules: dict[str, JobSchedule] = {}
        self.job_plans: dict[str, tuple[GroupPlan, JobPlan]] = {}
        self.state: dict[str, JobState] = {}
        self.queues: dict[str, GpuQueue] = {}
        self.holder: dict[str, PhaseRun] = {}  # GPU -> run warmed on / running on it
        self.lent: set[str] = set()  # GPUs held by a run that is not their own queue head
        self.down: set[str] = set()
        self.runs: dict[Key, PhaseRun] = {}
        self.syncs: dict[str, SyncRun] = {}
        self.records: list[dict] = []
        self.events: list[dict] = []  # restarts, plan switches, admissions (for the log)
        self.held: dict[str, HeldGroup] = {}
        self.held_timeline: list[tuple[float, float, dict[str, int]]] = []  # (t, $/h, GPUs per cluster)
        self.pending: PendingSwitch | None = None
        self.queued_plans: list[tuple[Plan, dict[str, float], str]] = []
        self.on_phase: list[Callable[[dict], None]] = []
        self.on_iteration: list[Callable[[str, int, float], None]] = []
        self.on_job_finished: list[Callable[[str, float], None]] = []
        self.on_switch: list[Callable[[Plan], None]] = []
        self.on_plan: list[Callable[[Plan], None]] = []  # a plan is asked for (before its groups drain)
        self.node_jobs: dict[str, set[str]] = {}  # node -> jobs whose group holds it (lending)
        self.rolling: dict[str, PhaseRun] = {}  # job -> its rollout that is computing
        # What the elastic rules did: tails moved, GPUs lent to a running rollout, loans taken back.
        self.elastic_counts = {"migrations": 0, "loans": 0, "reclaims": 0}
        self._factors: dict[tuple, float] = {}  # (job, phase, GPUs, type) -> ``_solo_factor``
        self._solo_sync: dict[str, float] = {}  # job -> its sync on its solo GPUs
        self._switch_cache: dict[tuple[str, str, str], float] = {}
        self._type_cache: dict[str, str] = {}
        backend.attach(self)
        if start_jobs:
            self._install(plan, {j for j in plan.jobs}, epoch=self.now, delays={})
            self._set_held(plan.groups)

    # ----- helpers --------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.backend.now()

    def _iterations_of(self, spec: JobSpec) -> int:
        if self.default_iterations is not None:
            return self.default_iterations
        return spec.iterations or 1

    def _allowed(self, job: str, k: int) -> bool:
        st = self.state.get(job)
        return st is not None and k < st.limit

    def _head(self, gpu: str) -> Key | None:
        q = self.queues.get(gpu)
        if q is None:
            return None
        while True:
            key = q.head(self._allowed)
            if key is None or self.state[key[0]].done[key[1]] < key[2]:
                return key
            q.pop(key)  # finished without this GPU (elastic rollout): move past it

    def _run(self, key: Key) -> PhaseRun | None:
        run = self.runs.get(key)
        if run is not None:
            return run
        job, phase, k = key
        if job not in self.job_plans:
            return None
        group, jp = self.job_plans[job]
        slot = jp.phase(phase)
        gpu_type = slot.gpu_type or self.topology.gpu_type_of(slot.gpus[0])
        elastic = phase == "rollout" and self.rules.elastic
        shares = self.rules.shares_per_gpu * len(slot.gpus) if elastic else len(slot.gpus)
        run = PhaseRun(job, phase, k, group.name, tuple(slot.gpus), gpu_type, slot.duration_s, elastic=elastic,
                       watch_threshold=self.rules.threshold if (elastic and self.rules.migrate) else None,
                       shares=shares)
        self.runs[key] = run
        return run

    def _deps_ready(self, run: PhaseRun) -> bool:
        st = self.state[run.job]
        k = run.iteration
        if run.phase == "rollout":
            return st.done["sync"] >= k - 1 - st.staleness and st.done["rollout"] >= k - 1 \
                and self.now >= st.not_before
        return st.done["rollout"] >= k and st.done["train"] >= k - 1

    # ----- dispatch ---------------------------------------------------------------------------
    def kick(self, gpus: Iterable[str]) -> None:
        for gpu in gpus:
            if gpu in self.down or (gpu in self.holder and gpu not in self.lent):
                continue
            key = self._head(gpu)
            run = self._run(key) if key is not None else None
            if run is not None:
                self._advance(run)
            if self.rules.lend:
                self._lend(gpu)

    def _advance(self, run: PhaseRun) -> None:
        if run.state in ("done", "aborted") or run.iteration >= self.state[run.job].limit:
            return  # a draining job starts no new iteration (its run may have been warmed already)
        ready = self._deps_ready(run)
        # A lent GPU is taken back only once the run can start: warming early would just undo the loan.
        free = [g for g in run.gpus if g not in run.held and g not in self.down
                and (g not in self.holder or (ready and g in self.lent)) and self._head(g) == run.key]
        if run.elastic:
            # A tail goes on with the GPUs it kept, unless their owners took them all back (loans):
            # then it takes its own again as they free up, or it would never end.
            if free and (run.state != "tail" or not run.held) and not (run.permitted and run.pending == 0):
                self._take(run, free)
        elif free and len(free) + len(run.held) == len(run.gpus):
            self._take(run, free)
        if run.held and not run.permitted and ready and (run.elastic or len(run.held) == len(run.gpus)):
            run.permitted = True
            run.state = "running"
            st = self.state[run.job]
            if run.phase == "rollout":
                self.rolling[run.job] = run
                st.rollout_starts.setdefault(run.iteration, self.now)
                if st.first_start is None:
                    st.first_start = self.now
            self.backend.permit(run)
            if self.rules.lend and run.phase == "rollout":
                self._offer_idle(run)

    def _take(self, run: PhaseRun, gpus: list[str]) -> None:
        for g in gpus:
            if g in self.lent:  # take a lent GPU back from its borrower
                borrower = self.holder[g]
                self.elastic_counts["reclaims"] += 1
                self.lent.discard(g)
                borrower.held.discard(g)
                del self.holder[g]
                self.backend.release(borrower, [g])
            self.holder[g] = run
            run.held.add(g)
        self.backend.warm(run, gpus)

    # ----- lending ----------------------------------------------------------------------------
    def _idle_for(self, gpu: str) -> float:
        """How long ``gpu`` is expected to wait for its next phase's inputs (planned durations)."""
        key = self._head(gpu)
        if key is None:
            return math.inf
        run = self._run(key)
        if run is None or run.permitted:
            return 0.0
        st = self.state[run.job]
        group, jp = self.job_plans[run.job]
        if run.phase == "train":
            chain, k = ["rollout"], run.iteration
        else:
            chain, k = ["rollout", "train", "sync"], run.iteration - 1 - st.staleness
        wait = 0.0
        for phase in chain:
            if st.done[phase] >= k:
                continue
            planned = jp.phase(phase).duration_s
            active = self.runs.get((run.job, phase, k)) if phase != "sync" else self.syncs.get(run.job)
            started = getattr(active, "started_s", None) if active is not None else None
            wait += max(0.0, planned - (self.now - started)) if started is not None else planned
        return max(wait, st.not_before - self.now)

    def _lendable(self, gpu: str) -> bool:
        """Free, or warmed for its next phase that still waits for its inputs."""
        if gpu in self.down or gpu in self.lent:
            return False
        run = self.holder.get(gpu)
        return run is None or (not run.permitted and self._head(gpu) == run.key)

    def _lend(self, gpu: str) -> None:
        """An idle GPU joins a running rollout of its group when it would idle long enough."""
        node = _node_of(gpu)
        # Lend only inside the group (its nodes pin the borrower's state), to rollouts in their bulk.
        candidates = [r for j in sorted(self.node_jobs.get(node, ())) if (r := self.rolling.get(j)) is not None
                      and r.state == "running" and gpu not in r.held and r.pending != 0]
        if not candidates or not self._lendable(gpu):
            return
        wait = self._idle_for(gpu)
        key = self._head(gpu)
        own = self._run(key) if key is not None else None
        gpu_type = self._gpu_type(gpu)
        best = None
        for run in candidates:
            spec = self.specs[run.job]
            if gpu_type not in spec.rollout.gpu_types:
                continue
            cost = self._switch(run.job, "rollout", node)
            if own is not None:
                cost += self._switch(own.job, own.phase, node)
            remaining = run.planned_s - (self.now - (run.started_s if run.started_s is not None else self.now))
            if min(wait, remaining) < self.rules.lend_min_gain * max(cost, 1e-3):
                continue
            if best is None or remaining > best[0]:
                best = (remaining, run)
        if best is not None:
            run = best[1]
            if own is not None and gpu in own.held:  # un-warm it; it is taken back when own is ready
                own.held.discard(gpu)
                del self.holder[gpu]
                self.backend.release(own, [gpu])
            self.holder[gpu] = run
            self.elastic_counts["loans"] += 1
            self.lent.add(gpu)
            run.held.add(gpu)
            self.backend.warm(run, [gpu])

    def _switch(self, job: str, kind: str, node: str) -> float:
        key = (job, kind, node)
        if key not in self._switch_cache:
            self._switch_cache[key] = self.model.switch_s(self.specs[job], kind, node)
        return self._switch_cache[key]

    def _gpu_type(self, gpu: str) -> str:
        t = self._type_cache.get(gpu)
        if t is None:
            t = self._type_cache[gpu] = self.topology.gpu_type_of(gpu)
        return t

    def _offer_idle(self, run: PhaseRun) -> None:
        """A rollout just started: idle GPUs of its group may join it."""
        if run.job not in self.job_plans:
            return
        for node in self.job_plans[run.job][0].nodes:
            for gpu in self.topology.node(node).gpu_ids:
                self._lend(gpu)

    # ----- backend callbacks ------------------------------------------------------------------
    def threshold_reached(self, run: PhaseRun) -> None:
        if run.state != "running" or not self.rules.migrate:
            return
        keep_n = max(1, math.ceil(self.rules.target_share * len(run.gpus)))
        # Keep the GPUs computing a prompt group (their work goes on), then the run's own before lent
        # ones (a loan, even of a GPU of its own plan, is taken back when its queue's next phase can run).
        order = {g: i for i, g in enumerate(run.gpus)}
        rank = {g: (g not in run.computing, g in self.lent, order.get(g, len(order)), g) for g in run.held}
        keep = sorted(run.held, key=rank.__getitem__)[:keep_n]
        freed = sorted(g for g in run.held if g not in keep)
        # Move the tail only when a freed GPU has a rollout to start: otherwise the tail would just
        # run slower on fewer GPUs while the others idle.
        if not any(self._startable_after(g, run) for g in freed):
            return
        run.state = "tail"
        self.elastic_counts["migrations"] += 1
        self.rolling.pop(run.job, None)
        self.backend.release(run, freed, tail=True)
        self._free(run, freed)
        self.kick(freed)

    def _startable_after(self, gpu: str, run: PhaseRun) -> bool:
        if gpu in self.lent:
            return True  # goes back to its own queue
        q = self.queues.get(gpu)
        key = q.after(run.key, self._allowed) if q is not None else None
        if key is None or key[1] != "rollout" or key == run.key:
            return False
        nxt = self._run(key)
        return nxt is not None and nxt.elastic and self._deps_ready(nxt)

    def _free(self, run: PhaseRun, gpus: Iterable[str]) -> None:
        for g in gpus:
            run.held.discard(g)
            if self.holder.get(g) is run:
                del self.holder[g]
            if g in self.lent:
                self.lent.discard(g)
            elif g in self.queues:
                self.queues[g].pop(run.key)

    def phase_done(self, run: PhaseRun, m: Measured) -> None:
        run.state = "done"
        if self.rolling.get(run.job) is run:
            del self.rolling[run.job]
        st = self.state[run.job]
        held = list(run.held)
        self._free(run, held)
        for g in run.gpus:  # planned GPUs the run never needed (it finished without them)
            if g in self.queues:
                self.queues[g].pop(run.key)
        self.runs.pop(run.key, None)
        st.done[run.phase] = run.iteration
        self._record(run.job, run.iteration, run.phase, run.group, m, run.planned_s, len(run.gpus))
        if run.phase == "train":
            self._start_sync(run)
        else:
            nxt = self.runs.get((run.job, "train", run.iteration))
            if nxt is not None:
                self._advance(nxt)
        self.kick(sorted(set(held) | set(run.gpus)))  # sorted: runs must not depend on hash order

    def _start_sync(self, train: PhaseRun) -> None:
        group, jp = self.job_plans[train.job]
        planned = jp.phase("sync").duration_s
        # A late sync delays the job's next rollout and, through the shared FIFO queues, every later
        # member of its group: the deadline uses the group's least SLO slack, a member's being its
        # planned slack per iteration plus what it has gained or lost so far (a member behind its
        # SLO syncs first on a shared link, one well ahead yields).
        slack = min((max(0.0, self.specs[m.name].slo * m.solo_iteration_s - m.iteration_s
                         + (self.slo_budget_s(m.name) if m.name in self.state else 0.0))
                     for m in group.jobs if m.name in self.specs), default=0.0)
        sync = SyncRun(train.job, train.iteration, group.name, tuple(jp.phase("train").gpus),
                       tuple(jp.phase("sync").gpus), planned, deadline_s=self.now + planned + slack)
        if any(_node_of(g) in self._down_nodes() for g in sync.train_gpus + sync.rollout_gpus):
            self._restart(train.job, "sync endpoint down")
            return
        self.syncs[train.job] = sync
        self.backend.start_sync(sync)

    def sync_done(self, run: SyncRun, m: Measured) -> None:
        if self.syncs.get(run.job) is run:
            del self.syncs[run.job]
        st = self.state[run.job]
        st.done["sync"] = run.iteration
        st.iteration_ends[run.iteration] = self.now
        st.solo_work_done_s += st.solo_work_s.pop(run.iteration, 0.0)
        self._record(run.job, run.iteration, "sync", run.group, m, run.planned_s, len(run.rollout_gpus))
        for hook in self.on_iteration:
            hook(run.job, run.iteration, self.now)
        if st.finished:
            st.finished_at = self.now
            self._set_held(self.plan.groups)
            for hook in self.on_job_finished:
                hook(run.job, self.now)
        self._check_pending()
        for k in (run.iteration + 1 + st.staleness, run.iteration + 1):
            nxt = self.runs.get((run.job, "rollout", k))
            if nxt is not None:
                self._advance(nxt)
        _, jp = self.job_plans.get(run.job, (None, None))
        if jp is not None:
            self.kick(jp.phase("rollout").gpus)

    def node_down(self, node: str) -> None:
        gpus = self.topology.node(node).gpu_ids
        self.down.update(gpus)
        self.events.append({"t": self.now, "event": "node_down", "node": node})
        hit: set[str] = set()
        for g in gpus:
            run = self.holder.get(g)
            if run is None:
                continue
            if g in self.lent:
                self._free(run, [g])
                self.backend.release(run, [g])
            else:
                hit.add(run.job)
        for job, sync in list(self.syncs.items()):
            if any(_node_of(g) == node for g in sync.train_gpus + sync.rollout_gpus):
                hit.add(job)
        for job in sorted(hit):
            self._restart(job, f"node {node} down")

    def node_up(self, node: str) -> None:
        gpus = self.topology.node(node).gpu_ids
        self.down.difference_update(gpus)
        self.events.append({"t": self.now, "event": "node_up", "node": node})
        self.kick(gpus)

    def _down_nodes(self) -> set[str]:
        return {_node_of(g) for g in self.down}

    def _drop(self, key, run) -> set[str]:
        """Forget a run that will not finish: its GPUs stop being held or lent. Returns them."""
        gpus = set(run.held)
        for g in gpus:
            run.held.discard(g)
            if self.holder.get(g) is run:
                del self.holder[g]
            self.lent.discard(g)
        run.state = "aborted"
        del self.runs[key]
        return gpus

    def _restart(self, job: str, reason: str) -> None:
        """Drop the job's unfinished iteration(s) and queue it again from the last completed one."""
        st = self.state[job]
        k = st.done["sync"] + 1
        touched: set[str] = set()
        for key, run in list(self.runs.items()):
            if key[0] != job or run.state in ("done", "aborted"):
                continue
            if run.held or run.permitted:
                self.backend.abort(run)
            touched |= self._drop(key, run)
        self.rolling.pop(job, None)
        sync = self.syncs.pop(job, None)
        if sync is not None:
            self.backend.abort(sync)
        _, jp = self.job_plans[job]
        for phase in ("train", "rollout"):  # pushed to the front: rollout ends up first
            for i in range(st.done[phase], k - 1, -1):
                for g in jp.phase(phase).gpus:
                    q = self.queues[g]
                    if q.head(self._allowed) != (job, phase, i):
                        q.front.appendleft((job, phase, i))
                    touched.add(g)
        lost = st.done["rollout"] - k + 1
        st.done["rollout"] = st.done["train"] = k - 1
        for i in [i for i in st.rollout_starts if i >= k]:
            del st.rollout_starts[i]
        st.restarts += 1
        self.events.append({"t": self.now, "event": "restart", "job": job, "iteration": k, "reason": reason,
                            "rollouts_discarded": max(0, lost)})
        self.kick(sorted(touched))

    # ----- records ----------------------------------------------------------------------------
    def _record(self, job: str, k: int, phase: str, group: str, m: Measured, planned_s: float, gpus: int) -> None:
        # ``gpus`` is the planned count and ``width_s`` the duration on it, so that a refit from these
        # records is not skewed by elastic runs; ``duration_s`` is the wall time it took.
        row = {"job": job, "iteration": k, "phase": phase, "gpus": gpus, "gpu_type": m.gpu_type,
               "start_s": m.start_s, "duration_s": max(m.end_s - m.start_s, 1e-9), "switch_s": m.switch_s,
               "tokens": float("nan"), "group": group, "planned_s": planned_s, "width_s": max(m.width_s, 1e-9),
               "end_s": m.end_s, "gpus_at_start": m.gpus, "attempt": self.state[job].restarts, "busy_gpu_s": m.busy_gpu_s, "switch_gpu_s": m.switch_gpu_s,
               "cluster": m.cluster, "nodes": self._nodes_of(job, phase), **m.extra}
        self.records.append(row)
        if phase != "sync":
            st = self.state[job]
            st.solo_work_s[k] = st.solo_work_s.get(k, 0.0) + row["width_s"] * self._solo_factor(job, phase, gpus,
                                                                                                   m.gpu_type)
        for hook in self.on_phase:
            hook(row)

    def _solo_factor(self, job: str, phase: str, gpus: int, gpu_type: str) -> float:
        """A phase's time on ``gpus`` GPUs of ``gpu_type`` moved to the job's solo GPUs."""
        key = (job, phase, gpus, gpu_type)
        if key not in self._factors:
            spec, catalog = self.specs[job].phase(phase), self.topology.gpu_types
            self._factors[key] = spec.duration_at(0.5, catalog=catalog) / spec.duration_at(0.5, gpus, gpu_type, catalog)
        return self._factors[key]

    def slo_budget_s(self, job: str) -> float:
        """The seconds ``job`` may still lose and meet its SLO, measured over its finished iterations:
        its SLO times their solo reference (their rollouts and trains as drawn, on its solo GPUs,
        plus a solo sync each) less the time they took. 0 before its first iteration ends."""
        st = self.state[job]
        n = st.done["sync"] + 1
        if n <= 0 or st.first_start is None:
            return 0.0
        spec = self.specs[job]
        if job not in self._solo_sync:
            rollout_gpus, train_gpus = self.model.solo_placement(spec)
            self._solo_sync[job] = self.model.sync_s(spec, train_gpus, rollout_gpus)
        reference = st.solo_work_done_s + n * self._solo_sync[job]
        return spec.slo * reference - (st.iteration_ends[st.done["sync"]] - st.first_start)

    def _nodes_of(self, job: str, phase: str) -> str:
        entry = self.job_plans.get(job)
        if entry is None:
            return ""
        return ",".join(sorted({_node_of(g) for g in entry[1].phase(phase).gpus}))

    # ----- plans --------------------------------------------------------------------------------
    def _install(self, plan: Plan, jobs: set[str], epoch: float, delays: dict[str, float]) -> None:
        self.plan = plan
        for group in plan.groups:
            for jp in group.jobs:
                if jp.name not in jobs:
                    continue
                spec = self.specs[jp.name]
                st = self.state.get(jp.name)
                if st is None:
                    st = self.state[jp.name] = JobState(spec, self._iterations_of(spec))
                first = st.done["sync"] + 1
                st.limit = st.total
                st.not_before = self.now + delays.get(jp.name, 0.0)  # planned times only order the queues
                if st.not_before > self.now:
                    self.backend.call_at(st.not_before, lambda j=jp.name: self._wake(j))
                sched = JobSchedule.build(group, jp, epoch, first)
                self.schedules[jp.name] = sched
                self.job_plans[jp.name] = (group, jp)
                for n in group.nodes:
                    self.node_jobs.setdefault(n, set()).add(jp.name)
                for phase in ("rollout", "train"):
                    slot = jp.phase(phase)
                    for g in slot.gpus:
                        q = self.queues.setdefault(g, GpuQueue())
                        q.add(sched, phase, first)
        touched = [g for j in jobs if j in self.job_plans for s in self.job_plans[j][1].phases
                   if s.phase != "sync" for g in s.gpus]
        self.kick(sorted(set(touched)))

    def _next_window(self, group: GroupPlan, anchor: JobSchedule) -> int:
        """The first cycle of ``group``'s timetable, counted from ``anchor``'s epoch, in which no member
        has started its rollout. A job joining there meets every member's phases in the plan's order;
        joining at the cycle of ``now`` put it ahead of members that run ahead of their planned times
        (durations drawn shorter than planned), and they waited for its phases every iteration."""
        window = 0
        for member in group.jobs:
            sched = self.schedules.get(member.name)
            if sched is None:
                continue
            st = self.state[member.name]
            started = max([k for (j, p, k), r in self.runs.items() if j == member.name and p == "rollout" and r.permitted],
                          default=st.done["rollout"])
            nxt = max(started, st.done["rollout"]) + 1
            window = max(window, round((sched.epoch_s - anchor.epoch_s) / group.cycle_s) + nxt - sched.first)
        return window

    def _wake(self, job: str) -> None:
        """The migration delay is over: a rollout warmed meanwhile may start."""
        if job not in self.job_plans:
            return
        for key, run in list(self.runs.items()):
            if key[0] == job:
                self._advance(run)
        self.kick(self.job_plans[job][1].phase("rollout").gpus)

    def add_job(self, spec: JobSpec) -> None:
        """Make a job known (trace arrivals) before a plan that places it is applied."""
        if spec.name not in self.specs:
            self.specs[spec.name] = spec
            self.jobs = JobSet(jobs=[*self.jobs.jobs, spec])
            self.model = PlanningModel(self.topology, self.jobs, self.plan.quantile)

    def update_spec(self, spec: JobSpec) -> None:
        """A refitted profile (drift): the controller's estimates use it from now on."""
        self.specs[spec.name] = spec
        self.jobs = JobSet(jobs=[spec if j.name == spec.name else j for j in self.jobs.jobs])
        self.model = PlanningModel(self.topology, self.jobs, self.plan.quantile)
        self._switch_cache.clear()
        self._factors = {k: f for k, f in self._factors.items() if k[0] != spec.name}
        self._solo_sync.pop(spec.name, None)
        if spec.name in self.state:
            self.state[spec.name].spec = spec

    def apply_plan(self, plan: Plan, *, delays: dict[str, float] | None = None, reason: str = "replan") -> None:
        """Switch to ``plan`` at the cycle boundary of each group it changes (see module doc)."""
        self.target = plan
        for hook in self.on_plan:
            hook(plan)
        if self.pending is not None:
            self.queued_plans.append((plan, dict(delays or {}), reason))
            return
        delays = dict(delays or {})
        old = self.job_plans
        new = plan.jobs
        changes = changed_jobs(old, new, lambda j: self.state[j].finished)
        running = {j for j in old if not self.state[j].finished}
        hot = hot_joins(changes, old, new)  # joins a group whose other timetables are untouched
        closure = affected(changes - hot, old, new)
        # Unchanged jobs keep their schedules but follow the new plan's group objects.
        for j in set(new) - closure - hot:
            if j in old:
                self.job_plans[j] = new[j]
                for n in new[j][0].nodes:
                    self.node_jobs.setdefault(n, set()).add(j)
        self.plan = plan
        if hot:
            for j in sorted(hot):
                group = new[j][0]
                anchor = next((self.schedules[x.name] for x in group.jobs if x.name in self.schedules), None)
                epoch = self.now
                if anchor is not None:
                    epoch = anchor.epoch_s + self._next_window(group, anchor) * group.cycle_s
                self._install(plan, {j}, epoch, delays)
            self.events.append({"t": self.now, "event": "admit", "jobs": sorted(hot), "reason": reason})
        draining = {j for j in closure if j in old and j in running}
        for j in draining:
            st = self.state[j]
            started = max([k for (jj, p, k), r in self.runs.items() if jj == j and p == "rollout" and r.permitted],
                          default=st.done["rollout"])
            st.limit = min(st.limit, max(started, st.done["rollout"]) + 1)
        # Runs past a drained job's last iteration give back the GPUs they were warmed on.
        freed: set[str] = set()
        for key, run in list(self.runs.items()):
            if key[0] in draining and not run.permitted and run.iteration >= self.state[key[0]].limit:
                if run.held:
                    self.backend.release(run, sorted(run.held))
                freed |= self._drop(key, run)
        self.pending = PendingSwitch(plan, {j for j in closure if j in new}, draining, delays, reason)
        self.kick(sorted(freed))
        if not closure:
            self.pending = None
            self._set_held(plan.groups)
            self._next_queued()
            return
        self._check_pending()

    def _check_pending(self) -> None:
        p = self.pending
        if p is None:
            return
        if any(self._busy(j) for j in p.draining):
            return
        self.pending = None
        for j in p.draining:
            sched = self.schedules.pop(j, None)
            if sched is None:
                continue
            old_group, jp = self.job_plans.pop(j)
            for n in old_group.nodes:
                self.node_jobs.get(n, set()).discard(j)
            for slot in jp.phases:
                if slot.phase != "sync":
                    for g in slot.gpus:
                        self.queues[g].drop_job(j)
            for key in [k for k in self.runs if k[0] == j]:
                run = self.runs.pop(key)
                for g in list(run.held):
                    run.held.discard(g)
                    if self.holder.get(g) is run:
                        del self.holder[g]
                    self.lent.discard(g)
        self._install(p.plan, p.jobs, self.now, p.delays)
        self._set_held(p.plan.groups)
        self.events.append({"t": self.now, "event": "switch", "jobs": sorted(p.jobs), "reason": p.reason,
                            "usd_per_hour": p.plan.cost_usd_per_hour})
        for hook in self.on_switch:
            hook(p.plan)
        self._next_queued()

    def _next_queued(self) -> None:
        if self.queued_plans and self.pending is None:
            plan, delays, reason = self.queued_plans.pop(0)
            target = self.target
            self.apply_plan(plan, delays=delays, reason=reason)
            self.target = target

    def unmovable(self, delay_s: float) -> list[str]:
        """Live jobs that would miss their SLO if a move stopped them for ``delay_s``: a replan keeps
        them where they are (their measured budget, ``slo_budget_s``, is under it). A move that stops
        no job makes none later."""
        if delay_s <= 0:
            return []
        return [j.name for j in self.live_jobs().jobs if j.name not in self.state or self.slo_budget_s(j.name) < delay_s]

    def live_jobs(self) -> JobSet:
        """Jobs of the latest plan that have not finished (what a replan must cover)."""
        return JobSet(jobs=[self.specs[j] for j in self.target.jobs
                            if j not in self.state or not self.state[j].finished])

    def _busy(self, job: str) -> bool:
        st = self.state[job]
        if job in self.syncs:
            return True
        if any(k[0] == job and r.permitted for k, r in self.runs.items()):
            return True
        return st.done["rollout"] > st.done["sync"]

    def _set_held(self, groups: Iterable[GroupPlan]) -> None:
        held: dict[str, HeldGroup] = {}
        for g in groups:
            # A group is paid for while any of its jobs has not finished (or not started yet).
            if any(j.name not in self.state or not self.state[j.name].finished for j in g.jobs):
                held[g.name] = HeldGroup(g.name, tuple(g.nodes), self.topology.cost_usd_per_hour(g.nodes))
        self.held = held
        per_cluster: dict[str, int] = {}
        nodes = {n for h in held.values() for n in h.nodes}
        for n in nodes:
            node = self.topology.node(n)
            per_cluster[node.cluster] = per_cluster.get(node.cluster, 0) + node.gpus
        self.held_timeline.append((self.now, self.topology.cost_usd_per_hour(nodes), per_cluster))

    # ----- driving ----------------------------------------------------------------------------
    def all_finished(self) -> bool:
        return all(st.finished for st in self.state.values()) and self.pending is None
