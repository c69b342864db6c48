"""Run a plan on the ``sim`` backend for N iterations: the library call behind ``weave simulate``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from weave_rl.executor.config import ElasticRules
from weave_rl.executor.controller import Controller
from weave_rl.executor.loop import drive
from weave_rl.executor.sim import DriftFn, Fault, SimBackend, SimModel
from weave_rl.planner.plan import Plan
from weave_rl.profiles.jobs import JobSet
from weave_rl.topology.topology import Topology

Progress = Callable[[float, float], None]  # (done share 0..1, simulated time)


@dataclass
class SimResult:
    controller: Controller
    backend: SimBackend
    wall_s: float
    events: int
    horizon_s: float
    replans: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def records(self) -> list[dict]:
        return self.controller.records


def simulate_plan(plan: Plan, topology: Topology, jobs: JobSet, *, iterations: int = 20, seed: int = 0,
                  rules: ElasticRules | None = None, model: SimModel | None = None, drift: DriftFn | None = None,
                  faults: Sequence[Fault] = (), progress: Progress | None = None,
                  setup: Callable[[Controller, SimBackend], None] | None = None,
                  max_events: int = 50_000_000) -> SimResult:
    """Every placed job runs ``iterations`` iterations; returns the controller with its records."""
    backend = SimBackend(topology, jobs, seed=seed, model=model, drift=drift, faults=faults, quantile=plan.quantile)
    wall = time.perf_counter()
    controller = Controller(backend, plan, topology, jobs, iterations=iterations, rules=rules)
    if setup is not None:
        setup(controller, backend)
    total = max(1, sum(st.total for st in controller.state.values()))

    def on_step(steps: int) -> None:
        if progress is not None and steps % 2000 == 0:
            done = sum(st.done["sync"] + 1 for st in controller.state.values())
            progress(done / total, backend.now())

    backend.start()
    try:
        drive(controller, backend, on_step=on_step, max_steps=max_events, label="simulation")
    finally:
        backend.stop()
    if progress is not None:
        progress(1.0, backend.now())
    return SimResult(controller, backend, time.perf_counter() - wall, backend.events.processed, backend.now())
