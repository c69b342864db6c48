"""``run_plan_local``: run a plan on worker processes of this machine (the library call behind ``weave run``).

Drift (``drift=DriftOptions(...)``, what ``weave run --replan`` passes): the controller's records of
real phases feed ``weave_rl.executor.drift.DriftReplanner``, with the jobs file's profiles as the expectation.
A phase measured past the threshold for K iterations has its job's profile refit from its records
(``weave_rl.profiles.fit``) and the planner's ``replan`` (``weave_rl.planner.online`` for an optimal plan, the
baseline policy's planner otherwise) solves again; the controller switches at the cycle boundary
of the groups the new plan changes. Moved jobs get no extra delay (``migration_delay_s`` 0): the
move itself (checkpoint restore, a cold worker) is what it costs here. Every detection, replan,
refit profile and plan switch goes to the journal; the solve runs in a thread while the plan in force keeps
running (``background``), and its plan is applied when ready (a resumed run continues on the plan in force),
every switched-to plan to ``DIR/plans/switch-<n>.yaml``, the replan log to ``DIR/replans.csv``.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from weave_rl.executor.config import ElasticRules
from weave_rl.executor.controller import Controller
from weave_rl.executor.loop import drive
from weave_rl.executor.local.backend import LocalBackend, pick_device
from weave_rl.executor.local.journal import Journal, JournalState
from weave_rl.planner.plan import Plan, plan_from_data, plan_to_data, save_plan
from weave_rl.profiles.jobs import JobSet, jobs_from_data, jobs_to_data
from weave_rl.topology.topology import Topology

Progress = Callable[[int, int, float], None]  # (iterations done, total, run time)

REPLAN_COLUMNS = ("t", "job", "phase", "reason", "usd_per_hour_before", "usd_per_hour_after", "moved", "solve_s",
                  "ready_t", "switch_t")


@dataclass(frozen=True)
class DriftOptions:
    """Drift detection and replanning on real measurements (``weave_rl.executor.drift``)."""

    threshold: float = 0.15  # |EWMA(measured / profile) - 1| past this ...
    k: int = 3  # ... for this many iterations in a row (and at least min_samples) is drift
    min_samples: int = 5
    alpha: float = 0.3
    migration_cost_s: float = 60.0  # the planner's price of moving a job (seconds of its GPUs)
    migration_delay_s: float = 0.0  # held back after a switch, on top of the real move
    time_limit_s: float = 10.0
    threads: int = 2
    replan: bool = True  # False: detect and log only


@dataclass
class LocalResult:
    controller: Controller | None
    backend: LocalBackend | None
    wall_s: float
    job_rows: list[dict] = field(default_factory=list)  # per job and iteration: reward, loss, ...
    events: list[dict] = field(default_factory=list)  # worker deaths and restarts
    resumed: dict[str, int] = field(default_factory=dict)  # job -> iterations already done before
    permit_latency: dict = field(default_factory=dict)
    replans: list[dict] = field(default_factory=list)  # drift replans (also before a resume)
    detections: list[dict] = field(default_factory=list)
    switches: int = 0  # plan switches that took effect

    @property
    def records(self) -> list[dict]:
        return self.controller.records if self.controller is not None else []


def remaining_plan(plan: Plan, done: dict[str, int]) -> Plan:
    """The plan without the jobs that have no iteration left (``done[job]`` = iterations done)."""
    groups = []
    for g in plan.groups:
        jobs = [j for j in g.jobs if j.name not in done]
        if jobs:
            groups.append(g.model_copy(update={"jobs": jobs}))
    return plan.model_copy(update={"groups": groups})


def jobs_by_gpu(plan: Plan) -> dict[str, set[str]]:
    """GPU -> the jobs of ``plan`` that use it (any phase)."""
    out: dict[str, set[str]] = {}
    for grp in plan.groups:
        for jp in grp.jobs:
            for slot in jp.phases:
                for g in slot.gpus:
                    out.setdefault(g, set()).add(jp.name)
    return out


def run_plan_local(plan: Plan, topology: Topology, jobs: JobSet, out: Path, *, iterations: int,
                   devices: dict[str, str], seed: int = 0, threads: int = 1, resume: bool = False,
                   inputs: dict | None = None, progress: Progress | None = None, pin_cores: bool = True,
                   setup: Callable[[Controller, LocalBackend], None] | None = None,
                   drift: DriftOptions | None = None, heartbeat_timeout_s: float = 10.0,
                   rules: ElasticRules | None = None,
                   backend_factory: Callable[..., LocalBackend] | None = None) -> LocalResult:
    """Every placed job runs ``iterations`` iterations on real workers; ``resume`` continues from DIR's journal
    (on the plan in force then); ``drift`` detects drift on the measurements and replans (module doc).
    ``backend_factory`` builds the backend in place of ``LocalBackend`` (same arguments): the Ray
    backend runs through this very loop (journal, resume, drift) with its actors."""
    out = Path(out)
    journal = Journal(out)
    past = journal.read() if resume else JournalState()
    if resume:
        journal.resumed(past.completed)
    else:
        journal.start_fresh(inputs or {})
        for old in (out / "plans").glob("switch-*.yaml") if (out / "plans").is_dir() else ():
            old.unlink()
    if past.plan is not None:
        plan = plan_from_data(past.plan, f"{journal.path} (plan in force)")
    if past.profiles:  # refit by a replan before the resume: the expectations from then on
        refit = jobs_from_data({"jobs": list(past.profiles.values())}, f"{journal.path} (refit profiles)",
                               topology.gpu_types)
        jobs = JobSet(jobs=[refit[j.name] if j.name in refit.names else j for j in jobs.jobs])
    offsets = {j: k + 1 for j, k in past.completed.items()}
    finished = {j for j, n in offsets.items() if n >= iterations}
    todo = remaining_plan(plan, {j: 1 for j in finished})
    live = JobSet(jobs=[j.model_copy(update={"iterations": iterations - offsets.get(j.name, 0)})
                        for j in jobs.jobs if j.name in todo.jobs])
    wall = time.perf_counter()
    result = LocalResult(None, None, 0.0, job_rows=list(past.metrics), events=list(past.events),
                         resumed={j: n for j, n in offsets.items()}, replans=list(past.replans),
                         detections=list(past.detections), switches=past.switches)
    if not todo.groups:
        result.wall_s = time.perf_counter() - wall
        return result
    gpu_jobs = jobs_by_gpu(todo)
    gpus = sorted(gpu_jobs)
    mapped = {g: devices[g] for g in gpus if g in devices}
    for g in gpus:  # a GPU only the plan in force (after a replan) uses
        if g not in mapped:
            mapped[g] = pick_device(mapped, sorted(set(devices.values())) or None)
    backend = (backend_factory or LocalBackend)(topology, jobs, mapped, out, seed=seed, threads=threads,
                           offsets=offsets, clock_start=past.last_t, pin_cores=pin_cores, gpu_jobs=gpu_jobs,
                           heartbeat_timeout_s=heartbeat_timeout_s)
    backend.on_metric.append(journal.metric)
    try:
        backend.start()
        # The plan's elastic rules unless ``rules`` says otherwise (``ElasticRules.off()``: --static).
        # Nothing reports back before step(), so the hooks below see every phase.
        controller = Controller(backend, todo, topology, live, iterations=None, rules=rules)
        controller.records.extend(past.records)

        def on_phase(row: dict) -> None:
            if row["phase"] == "rollout":
                row["tokens"] = float(backend.tokens.get((row["job"], row["iteration"]), math.nan))
            row["iteration"] += offsets.get(row["job"], 0)
            journal.record(row)

        def on_iteration(job: str, k: int, t: float) -> None:
            journal.iteration(job, k + offsets.get(job, 0), t)

        switches = [past.switches]

        def on_switch(new: Plan) -> None:
            backend.forget_stale(list(controller.runs.values()))
            switches[0] += 1
            event = next((e for e in reversed(controller.events) if e["event"] == "switch"), {})
            journal.plan(plan_to_data(controller.plan), event.get("t", controller.now), event.get("reason", ""))
            save_plan(controller.plan, out / "plans" / f"switch-{switches[0]}.yaml")

        controller.on_phase.append(on_phase)
        controller.on_iteration.append(on_iteration)
        controller.on_switch.append(on_switch)
        controller.on_plan.append(lambda new: backend.prepare(jobs_by_gpu(new)))
        replanner = _replanner(controller, topology, todo, drift) if drift is not None else None
        logged = [len(backend.events), 0, 0]  # worker events, detections, replans journaled

        def flush() -> None:
            for e in backend.events[logged[0]:]:
                journal.event(e)
            logged[0] = len(backend.events)
            if replanner is not None:
                for row in replanner.detections[logged[1]:]:
                    journal.detection(row)
                for row in replanner.log[logged[2]:]:
                    journal.profile(row["job"], jobs_to_data(JobSet(jobs=[controller.specs[row["job"]]]))["jobs"][0])
                    journal.replan(row)
                logged[1:] = [len(replanner.detections), len(replanner.log)]

        if setup is not None:
            setup(controller, backend)
        total = iterations * len(todo.jobs)

        def on_step(_: int) -> None:
            flush()
            if progress is not None:
                done = sum(offsets.get(j, 0) + st.done["sync"] + 1 for j, st in controller.state.items())
                progress(done, total, backend.now())

        try:
            drive(controller, backend, on_step=on_step, label="local run")
        finally:
            if replanner is not None:
                replanner.finish()  # a replan still solving is waited for and logged
            flush()  # a failed phase's event (phase_failed, with its error) reaches the journal too
    finally:
        backend.stop()
        journal.close()
    result.controller = controller
    result.backend = backend
    result.wall_s = time.perf_counter() - wall
    result.job_rows += [backend.job_rows[k] for k in sorted(backend.job_rows) if "ledger" in backend.job_rows[k]]
    result.job_rows.sort(key=lambda r: (r["job"], r["iteration"]))
    result.events += backend.events
    result.permit_latency = backend.permit_latency()
    result.switches = switches[0]
    if replanner is not None:
        result.detections += replanner.detections
        result.replans += _with_switch_times(replanner.log, controller.events)
    if drift is not None or result.replans:
        write_replans(out / "replans.csv", result.replans)
    return result


def _replanner(controller: Controller, topology: Topology, plan: Plan, options: DriftOptions):
    """A DriftReplanner on ``controller``, replanning through the planner of ``plan``'s policy."""
    from weave_rl.executor.drift import DriftReplanner
    from weave_rl.planner.plan import POLICIES

    planner = None
    if options.replan:
        live = JobSet(jobs=[controller.specs[j] for j in plan.jobs])
        if plan.policy == "optimal":
            from weave_rl.planner.online import OnlinePlanner

            planner = OnlinePlanner(topology, live, plan, quantile=plan.quantile)
        elif plan.policy in POLICIES:
            from weave_rl.executor.trace import BaselinePlanner

            planner = BaselinePlanner(topology, plan.policy, quantile=plan.quantile,
                                      time_limit_s=options.time_limit_s, threads=options.threads)
            planner.plan = plan
            planner.live = {j.name: j for j in live.jobs}
        else:  # a hand-made plan: detect and log, there is no planner to ask
            controller.events.append({"t": controller.now, "event": "no_replanner", "policy": plan.policy})
    return DriftReplanner(controller, planner, threshold=options.threshold, k=options.k, alpha=options.alpha,
                          min_samples=options.min_samples, migration_cost_s=options.migration_cost_s,
                          migration_delay_s=options.migration_delay_s, time_limit_s=options.time_limit_s,
                          threads=options.threads, records_file="<weave run records>",
                          background=True)  # the solve runs while the plan in force keeps running


def _with_switch_times(log: list[dict], events: list[dict]) -> list[dict]:
    """Each replan with the time its plan took effect (None: it changed nothing, or never did)."""
    used: set[int] = set()
    out = []
    for row in log:
        hit = next((i for i, e in enumerate(events) if i not in used and e["event"] == "switch"
                    and e.get("reason") == f"drift: {row['reason']}" and e["t"] >= row["t"]), None)
        if hit is not None:
            used.add(hit)
        out.append({**row, "switch_t": events[hit]["t"] if hit is not None else None})
    return out


def write_replans(path: Path, rows: list[dict]) -> None:
    """``replans.csv``: one row per drift replan (moved jobs separated by spaces)."""
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(REPLAN_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "moved": " ".join(r.get("moved") or [])})
