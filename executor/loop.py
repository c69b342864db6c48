"""The one run loop: step a backend until the controller's jobs are done (every backend, every mode).

``simulate_plan`` (sim), ``run_trace`` (arrivals over time) and ``run_plan_local`` (worker processes
or Ray actors) all drive their controller through ``drive``; what differs between them is the backend
they hand it and the hooks they attach, not the loop, its end condition or how a stall is reported.
"""

from __future__ import annotations

from typing import Callable

from weave_rl.executor.backend import Backend
from weave_rl.executor.controller import Controller


class Stalled(RuntimeError):
    """The backend has nothing left to report while jobs are unfinished (a bug, never a user error)."""


def drive(controller: Controller, backend: Backend, *, finished: Callable[[], bool] | None = None,
          on_step: Callable[[int], None] | None = None, max_steps: int | None = None, label: str = "run") -> int:
    """Step ``backend`` until ``finished()`` (default: every job of the controller has finished and no
    plan switch is pending), calling ``on_step(steps)`` after each step; returns the steps taken."""
    finished = finished or controller.all_finished
    steps = 0
    while not finished() and backend.step():
        steps += 1
        if on_step is not None:
            on_step(steps)
        if max_steps is not None and steps >= max_steps:
            raise Stalled(f"{label} did not finish within {max_steps} events")
    unfinished = sorted(j for j, st in controller.state.items() if not st.finished and j in controller.target.jobs)
    if unfinished or controller.pending is not None:
        raise Stalled(f"{label} stalled at t={backend.now():.1f} s with unfinished jobs: {', '.join(unfinished[:5])}")
    return steps
