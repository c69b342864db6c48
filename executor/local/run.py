"""``run_plan_local``: run a plan on worker processes of this machine (the library call behind ``weave run``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from executor.config import ElasticRules
from executor.controller import Controller
from executor.local.backend import LocalBackend
from executor.local.journal import Journal, JournalState
from planner.plan import Plan
from profiles.jobs import JobSet
from topology.topology import Topology

Progress = Callable[[int, int, float], None]  # (iterations done, total, run time)


@dataclass
class LocalResult:
    controller: Controller | None
    backend: LocalBackend | None
    wall_s: float
    job_rows: list[dict] = field(default_factory=list)  # per job and iteration: reward, loss, ...
    events: list[dict] = field(default_factory=list)  # worker deaths and restarts
    resumed: dict[str, int] = field(default_factory=dict)  # job -> iterations already done before
    permit_latency: dict = field(default_factory=dict)

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


def run_plan_local(plan: Plan, topology: Topology, jobs: JobSet, out: Path, *, iterations: int,
                   devices: dict[str, str], seed: int = 0, threads: int = 1, resume: bool = False,
                   inputs: dict | None = None, progress: Progress | None = None, pin_cores: bool = True,
                   setup: Callable[[Controller, LocalBackend], None] | None = None) -> LocalResult:
    """Every placed job runs ``iterations`` iterations on real workers; ``resume`` continues from DIR's journal."""
    out = Path(out)
    journal = Journal(out)
    past = journal.read() if resume else JournalState()
    if not resume:
        journal.start_fresh(inputs or {})
    offsets = {j: k + 1 for j, k in past.completed.items()}
    finished = {j for j, n in offsets.items() if n >= iterations}
    todo = remaining_plan(plan, {j: 1 for j in finished})
    live = JobSet(jobs=[j.model_copy(update={"iterations": iterations - offsets.get(j.name, 0)})
                        for j in jobs.jobs if j.name in todo.jobs])
    wall = time.perf_counter()
    result = LocalResult(None, None, 0.0, job_rows=list(past.metrics), events=list(past.events),
                         resumed={j: n for j, n in offsets.items()})
    if not todo.groups:
        result.wall_s = time.perf_counter() - wall
        return result
    gpus = sorted({g for grp in todo.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    gpu_jobs: dict[str, set[str]] = {}
    for grp in todo.groups:
        for jp in grp.jobs:
            for slot in jp.phases:
                for g in slot.gpus:
                    gpu_jobs.setdefault(g, set()).add(jp.name)
    backend = LocalBackend(topology, jobs, {g: devices[g] for g in gpus}, out, seed=seed, threads=threads,
                           offsets=offsets, clock_start=past.last_t, pin_cores=pin_cores, gpu_jobs=gpu_jobs)
    backend.on_metric.append(journal.metric)
    try:
        backend.start()
        # Elastic rules are off: no long-tail migration, no lending (the workers run whole phases).
        # Nothing reports back before step(), so the hooks below see every phase.
        controller = Controller(backend, todo, topology, live, iterations=None, rules=ElasticRules.off())
        controller.records.extend(past.records)

        def on_phase(row: dict) -> None:
            if row["phase"] == "rollout":
                row["tokens"] = float(backend.tokens.get((row["job"], row["iteration"]), math.nan))
            row["iteration"] += offsets.get(row["job"], 0)
            journal.record(row)

        def on_iteration(job: str, k: int, t: float) -> None:
            journal.iteration(job, k + offsets.get(job, 0), t)

        controller.on_phase.append(on_phase)
        controller.on_iteration.append(on_iteration)
        seen = len(backend.events)
        if setup is not None:
            setup(controller, backend)
        total = iterations * len(todo.jobs)
        while not controller.all_finished() and backend.step():
            for e in backend.events[seen:]:
                journal.event(e)
            seen = len(backend.events)
            if progress is not None:
                done = sum(offsets.get(j, 0) + st.done["sync"] + 1 for j, st in controller.state.items())
                progress(done, total, backend.now())
        for e in backend.events[seen:]:
            journal.event(e)
        unfinished = [j for j, st in controller.state.items() if not st.finished]
        if unfinished:
            raise RuntimeError(f"local run stalled at t={backend.now():.1f} s with unfinished jobs: "
                               f"{', '.join(sorted(unfinished))}")
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
    return result
