"""Drift: injecting it into a simulation, detecting it, and replanning when it persists.

Injection (``--drift SPEC``, comma-separated items):

- ``JOB:PHASE:FACTOR@TIME`` -- from TIME seconds on, PHASE (``rollout``, ``train`` or ``*``) of JOB
  (a name or ``*``) takes FACTOR times its profiled duration; a later matching item replaces an
  earlier one. Example: ``A:rollout:1.5@3600,*:train:0.8@7200``.
- ``increasing:M``, ``decreasing:M``, ``mixed:M`` -- the paper's templates (Weave 6.6): every job's
  rollout drifts linearly over its life (from its arrival for ``iterations x solo iteration``
  seconds) from 1x to ``1 + M`` times (increasing) or to ``1 / (1 + M)`` times (decreasing); mixed
  alternates the two by job order. The paper's magnitudes are M = 0.5, 1.0, 1.5.

Detection (``DriftDetector``): per job and phase an EWMA (weight ``alpha`` on the newest value) of
measured / expected duration, where *measured* is the phase's duration on its planned GPUs (the
``width_s`` of its record) and *expected* is the mean of the job's current profile on those GPUs.
(The plan's own durations are a high quantile, so comparing with them would flag every noisy job
as faster than planned.) When ``|EWMA - 1| > threshold`` for ``k`` consecutive iterations of that
phase (and at least ``min_samples`` iterations, so that the refit has data), the job is reported
once and its EWMA restarts. ``alpha`` defaults to 0.3: with 10% noise the EWMA then wanders by
about 4%, so a 15% threshold is not crossed by noise alone.

Replanning (``DriftReplanner``): refit the job's profile from its records since the drift showed
(at most the last ``window`` iterations; ``weave_rl.profiles.fit.fit_jobs``), then call the planner's ``replan`` with all live jobs; the
controller switches to the new plan at the cycle boundary of the groups it changes, charging moved
jobs ``migration_cost_s`` (the planner's price of a move, and by default the delay before a moved job
starts again; ``migration_delay_s`` sets the delay apart, e.g. 0 on real workers, where the move
itself takes the time). Every replan is logged: time, job, reason, $/h before and after, moved,
and the seconds the solve took (``solve_s``).

``background=True`` (real workers, where time does not wait): the solve runs in a thread of its own
while the plan in force keeps running, and the new plan is applied (at the cycle boundary, as
always) once it is ready; the controller polls for it every ``poll_s``; one still solving when the
run ends is waited for (``finish``) and logged, not applied. The simulator solves inline:
its clock is virtual, so a solve costs no simulated time either way, and runs stay reproducible.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Protocol

import pandas as pd

from weave_rl.executor.controller import Controller
from weave_rl.profiles.fit import fit_jobs
from weave_rl.profiles.jobs import JobSet
from weave_rl.core.errors import InputError

TEMPLATES = ("increasing", "decreasing", "mixed")
SYNTAX = "JOB:PHASE:FACTOR@TIME or increasing:M / decreasing:M / mixed:M, comma-separated"


@dataclass(frozen=True)
class StepDrift:
    job: str
    phase: str
    factor: float
    at_s: float


@dataclass(frozen=True)
class RampDrift:
    job: str
    magnitude: float
    increasing: bool
    start_s: float
    length_s: float

    def factor(self, t: float) -> float:
        x = min(1.0, max(0.0, (t - self.start_s) / self.length_s)) if self.length_s > 0 else 1.0
        return 1.0 + self.magnitude * x if self.increasing else 1.0 / (1.0 + self.magnitude * x)


@dataclass(frozen=True)
class DriftSpec:
    steps: tuple[StepDrift, ...] = ()
    template: tuple[str, float] | None = None

    def injector(self, jobs: JobSet, lifetime_s: Callable[[str], float]) -> Callable[[str, str, float], float]:
        """``(job, phase, t) -> factor`` for the sim backend."""
        ramps: dict[str, RampDrift] = {}
        if self.template is not None:
            kind, m = self.template
            for i, job in enumerate(jobs.jobs):
                up = kind == "increasing" or (kind == "mixed" and i % 2 == 0)
                ramps[job.name] = RampDrift(job.name, m, up, job.arrival_s, lifetime_s(job.name))
        steps = sorted(self.steps, key=lambda s: s.at_s)

        def factor(job: str, phase: str, t: float) -> float:
            f = 1.0
            for s in steps:
                if s.at_s <= t and s.job in ("*", job) and s.phase in ("*", phase):
                    f = s.factor
            ramp = ramps.get(job)
            if ramp is not None and phase == "rollout":
                f *= ramp.factor(t)
            return f

        return factor


def parse_drift(text: str | None, jobs: JobSet | None = None, source: str = "--drift") -> DriftSpec:
    if not text:
        return DriftSpec()
    steps: list[StepDrift] = []
    template = None
    for item in (p.strip() for p in text.split(",")):
        head, _, value = item.partition(":")
        if head in TEMPLATES:
            try:
                m = float(value)
            except ValueError:
                raise InputError("<command line>", source, f"bad drift template {item!r}: expected {head}:M") from None
            if m <= 0:
                raise InputError("<command line>", source, f"bad drift template {item!r}: M must be > 0")
            template = (head, m)
            continue
        parts = item.split(":")
        if len(parts) != 3 or "@" not in parts[2]:
            raise InputError("<command line>", source, f"bad drift {item!r}: expected {SYNTAX}")
        job, phase, rest = parts
        f_text, _, t_text = rest.partition("@")
        try:
            f, t = float(f_text), float(t_text)
        except ValueError:
            raise InputError("<command line>", source, f"bad drift {item!r}: expected {SYNTAX}") from None
        if phase not in ("rollout", "train", "*"):
            raise InputError("<command line>", source, f"bad drift {item!r}: phase must be rollout, train or *")
        if f <= 0 or t < 0:
            raise InputError("<command line>", source, f"bad drift {item!r}: FACTOR must be > 0 and TIME >= 0")
        if jobs is not None and job != "*" and job not in jobs.names:
            raise InputError("<command line>", source, f"unknown job {job!r} in drift {item!r}")
        steps.append(StepDrift(job, phase, f, t))
    return DriftSpec(tuple(steps), template)


# ----- detection ------------------------------------------------------------------------------
@dataclass
class _Track:
    ewma: float | None = None
    over: int = 0
    since: int = 0  # first iteration of the current run over the threshold


@dataclass
class DriftDetector:
    expected: Callable[[str, str, int, str], float]  # (job, phase, gpus, gpu_type) -> profile mean there
    threshold: float = 0.15
    k: int = 3
    alpha: float = 0.3
    min_samples: int = 5  # drifted iterations needed before refitting (a 3-sample fit is mostly noise)
    tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)

    def observe(self, row: dict) -> tuple[str, str, float, int] | None:
        """Feed one record; returns (job, phase, EWMA, first drifted iteration) when the phase drifted."""
        if row["phase"] not in ("rollout", "train"):
            return None
        ratio = row["width_s"] / self.expected(row["job"], row["phase"], int(row["gpus"]), row["gpu_type"])
        tr = self.tracks.setdefault((row["job"], row["phase"]), _Track())
        tr.ewma = ratio if tr.ewma is None else self.alpha * ratio + (1 - self.alpha) * tr.ewma
        if abs(tr.ewma - 1) > self.threshold:
            tr.since = tr.since if tr.over else int(row["iteration"])
            tr.over += 1
        else:
            tr.over = 0
        if tr.over >= max(self.k, self.min_samples):
            hit = (row["job"], row["phase"], tr.ewma, tr.since)
            self.tracks[(row["job"], row["phase"])] = _Track()
            return hit
        return None

    def reset(self, job: str) -> None:
        for key in [k for k in self.tracks if k[0] == job]:
            del self.tracks[key]


class ReplanPlanner(Protocol):
    """The part of ``weave_rl.planner.online.OnlinePlanner`` that drift replanning calls."""

    def replan(self, jobs: JobSet, *, migration_cost_s: float = 60.0, time_limit_s: float = 10.0,
               threads: int = 2, keep: Collection[str] = ()) -> Any: ...


class DriftReplanner:
    """Wires a detector into a controller; replans through ``planner`` (or only logs when it is None)."""

    def __init__(self, controller: Controller, planner: ReplanPlanner | None, *, threshold: float = 0.15,
                 k: int = 3, alpha: float = 0.3, min_samples: int = 5, window: int = 10,
                 migration_cost_s: float = 60.0, time_limit_s: float = 10.0, threads: int = 2,
                 migration_delay_s: float | None = None, records_file: str = "<simulation>",
                 background: bool = False, poll_s: float = 0.05):
        self.controller = controller
        self.background = background
        self.poll_s = poll_s
        self.planner = planner
        self.window = window
        self.migration_cost_s = migration_cost_s
        self.migration_delay_s = migration_cost_s if migration_delay_s is None else migration_delay_s
        self.records_file = records_file
        self.time_limit_s = time_limit_s
        self.threads = threads
        self.detector = DriftDetector(self._expected, threshold, k, alpha, min_samples)
        self.log: list[dict] = []
        self.detections: list[dict] = []
        self._busy = False
        self._solving: tuple | None = None  # a background solve: (thread, its outcome, _apply's arguments)
        controller.on_phase.append(self._on_phase)

    def _expected(self, job: str, phase: str, gpus: int, gpu_type: str) -> float:
        spec = self.controller.specs[job].phase(phase)
        mean = spec.duration_s.mean()
        return mean * spec.duration_at(0.5, gpus, gpu_type, self.controller.topology.gpu_types) \
            / spec.duration_s.quantile(0.5)

    def _on_phase(self, row: dict) -> None:
        hit = self.detector.observe(row)
        if hit is None:
            return
        job, phase, ewma, since = hit
        self.detections.append({"t": self.controller.now, "job": job, "phase": phase, "ewma": ewma,
                                "iteration": int(row["iteration"]), "since": since})
        if self.planner is not None and not self._busy:
            # Replan after the current event: the controller is in the middle of a callback.
            self._busy = True
            self.controller.backend.call_at(self.controller.now, lambda: self._replan(job, phase, ewma, since))

    def _replan(self, job: str, phase: str, ewma: float, since: int) -> None:
        self._busy = False
        c = self.controller
        if c.state[job].finished:
            return
        # Refit from the iterations since the drift showed (older ones describe the old profile),
        # at most the last ``window`` of them; the phase that did not drift keeps its latest runs.
        rows = [r for r in c.records if r["job"] == job and r["phase"] in ("rollout", "train")]
        last = max(r["iteration"] for r in rows)
        first = max(since, last - self.window + 1)
        rows = [dict(r, duration_s=r["width_s"]) for r in rows if r["iteration"] >= first]
        fitted = fit_jobs(pd.DataFrame(rows), JobSet(jobs=[c.specs[job]]), records_file=self.records_file,
                          gpu_types=c.topology.gpu_types)[job]
        c.update_spec(fitted)
        self.detector.reset(job)
        live = c.live_jobs()
        before = c.plan.cost_usd_per_hour
        asked = c.now
        keep = c.unmovable(self.migration_delay_s)
        solve = lambda: self.planner.replan(live, migration_cost_s=self.migration_cost_s,  # noqa: E731
                                            time_limit_s=self.time_limit_s, threads=self.threads, keep=keep)
        if not self.background:
            started = time.perf_counter()
            self._apply(solve(), job, phase, ewma, live, before, asked, time.perf_counter() - started)
            return
        self._busy = True  # one solve at a time; detections meanwhile are logged, not replanned
        outcome: dict[str, Any] = {}

        def work() -> None:
            started = time.perf_counter()
            try:
                outcome["result"] = solve()
            except BaseException as exc:  # noqa: BLE001  re-raised in the controller's thread
                outcome["error"] = exc
            outcome["solve_s"] = time.perf_counter() - started

        def poll() -> None:
            if self._solving is None:  # finish() took it
                return
            if "solve_s" not in outcome:
                c.backend.call_at(c.now + self.poll_s, poll)
                return
            self._busy, self._solving = False, None
            if "error" in outcome:
                raise outcome["error"]
            self._apply(outcome["result"], job, phase, ewma, live, before, asked, outcome["solve_s"])

        thread = threading.Thread(target=work, name=f"replan-{job}", daemon=True)
        self._solving = (thread, outcome, (job, phase, ewma, live, before, asked))
        thread.start()
        c.backend.call_at(c.now + self.poll_s, poll)

    def finish(self) -> None:
        """Wait for a replan still solving when the run stops, and log it, not applied. The solve must
        not outlive the run: the interpreter's exit under a running solver thread (numba's LLVM, CP-SAT)
        can abort the process ("terminate called without an active exception")."""
        if self._solving is None:
            return
        thread, outcome, (job, phase, ewma, live, before, asked) = self._solving
        thread.join()
        self._busy, self._solving = False, None
        error = outcome.get("error")
        done = all(self.controller.state[j].finished for j in live.names)
        why = (f"its solve failed: {type(error).__name__}: {error}" if error is not None
               else "every job finished while it was solved" if done else "the run stopped while it was solved")
        self._apply(outcome.get("result"), job, phase, ewma, live, before, asked, outcome["solve_s"], stopped=why)

    def _apply(self, result, job: str, phase: str, ewma: float, live: JobSet, before: float, asked: float,
               solve_s: float, stopped: str | None = None) -> None:
        """Log a finished replan and hand its plan to the controller (kept out when it would leave a
        running job unplaced, when every job finished while it was solved, or when the run ``stopped``:
        then it is only logged, with that reason)."""
        c = self.controller
        needed = max(self.detector.k, self.detector.min_samples)
        reason = f"{job} {phase} at {ewma:.2f}x of its profile for {needed} iterations"
        timing = {"t": asked, "ready_t": c.now, "solve_s": round(solve_s, 4)}
        still = JobSet(jobs=[j for j in live.jobs if not c.state[j.name].finished])
        why = stopped or getattr(result, "kept", None)  # kept: the planner kept the plan in force itself
        if why is None:
            unplaced = sorted(set(still.names) - set(result.plan.jobs))
            why = (f"the new one leaves {', '.join(unplaced)} unplaced" if unplaced
                   else None if still.jobs else "every job finished while it was solved")
        if why is not None:
            if stopped is None:
                # Switching would stop a running job for good (e.g. the refit tightened another job's
                # SLO on a topology with no room left): keep the plan in force, and the planner in step.
                self._resync(still)
            self.log.append({**timing, "job": job, "phase": phase,
                             "reason": f"{reason}; kept the plan in force ({why})",
                             "usd_per_hour_before": before, "usd_per_hour_after": before, "moved": []})
            return
        moved = list(getattr(result, "moved", []))
        self.log.append({**timing, "job": job, "phase": phase, "reason": reason,
                         "usd_per_hour_before": getattr(result, "cost_before", before),
                         "usd_per_hour_after": getattr(result, "cost_after", result.plan.cost_usd_per_hour),
                         "moved": moved})
        c.apply_plan(result.plan, delays={m: self.migration_delay_s for m in moved}, reason=f"drift: {reason}")

    def _resync(self, live: JobSet) -> None:
        """Put the planner back on the controller's plan after a replan that was not applied."""
        c, p = self.controller, self.planner
        target = c.target
        specs = JobSet(jobs=[c.specs[j] for j in target.jobs])
        if hasattr(p, "groups") and hasattr(p, "link_budget"):  # planner.online.OnlinePlanner: rebuild in place
            p.__init__(c.topology, specs, target, quantile=p.quantile, max_group_size=p.max_group_size,
                       max_trials=p.max_trials, link_budget=p.link_budget)
        elif hasattr(p, "adopt"):  # executor.trace.BaselinePlanner
            p.adopt(target, specs)
