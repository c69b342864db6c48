"""The one small interface between the controller and whatever runs the phases (DESIGN section 5).

The controller decides *what* runs *where* and *when it may start*; a backend makes it happen and
reports back. The same controller drives the ``sim`` backend (discrete events) and, in later issues,
``local`` worker processes and ``ray`` actors, so nothing here mentions simulation.

Life of a GPU phase (rollout or train), mirroring the phase shim of DESIGN 5:

1. ``warm(run, gpus)``: the GPUs are the run's from now on; each loads the job's state for that role
   from host memory if it holds something else (the warm switch). The controller calls it as soon as
   the GPUs are free and the run is at the head of their queues, before the run's inputs are ready,
   so switches overlap the previous phase as in the plan's timetable.
2. ``permit(run)``: the run's inputs are ready; compute starts on every warmed GPU once its switch
   is done. An elastic run (rollout) starts on the GPUs it has and grows with later ``warm`` calls;
   a real backend splits it into ``run.shares`` prompt groups that its GPUs pull one at a time.
3. ``release(run, gpus, tail=True)``: long-tail migration, the run keeps the other GPUs (a prompt group
   running on a released GPU is taken back and regenerated from its seeds on one that stays); the same
   call without ``tail`` takes a lent GPU back.
4. The backend reports ``threshold_reached`` (the share of responses in ``run.watch_threshold`` is
   done), then ``phase_done`` with what it measured.

A weight sync holds no GPU: ``start_sync(run)`` -> ``sync_done``. Faults arrive as ``node_down`` /
``node_up``; ``abort(run)`` stops a run whose state is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


@dataclass(eq=False)
class PhaseRun:
    """One phase of one iteration of one job, as the controller hands it to a backend."""

    job: str
    phase: str  # rollout | train
    iteration: int
    group: str
    gpus: tuple[str, ...]  # the planned GPUs
    gpu_type: str
    planned_s: float  # the plan's duration for this phase
    elastic: bool = False  # may start on part of its GPUs, grow, and hand GPUs back (rollout)
    watch_threshold: float | None = None  # report when this share of responses is done
    held: set[str] = field(default_factory=set)  # GPUs warmed for / running this run
    permitted: bool = False
    state: str = "queued"  # queued | running | tail | done | aborted
    started_s: float | None = None  # first compute (after the switch)
    shares: int = 0  # prompt groups of an elastic rollout (0: one per planned GPU, each GPU its own)
    # Kept up to date by a backend that runs prompt groups (None: it does not tell): groups not yet
    # started, and the GPUs computing one now. The controller grows only a run with groups left and
    # keeps the computing GPUs when it moves a tail.
    pending: int | None = None
    computing: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.job, self.phase, self.iteration)


@dataclass(eq=False)
class SyncRun:
    job: str
    iteration: int
    group: str
    train_gpus: tuple[str, ...]
    rollout_gpus: tuple[str, ...]
    planned_s: float
    state: str = "running"
    # When the transfer should be done for the job to keep its SLO (start + planned time + the job's
    # slack per iteration); a backend that schedules a shared link serves earliest deadlines first.
    deadline_s: float = float("inf")

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.job, "sync", self.iteration)


@dataclass(frozen=True)
class Measured:
    """What a backend measured for one finished phase or sync."""

    start_s: float  # compute start (after the warm switch), or transfer start
    end_s: float
    switch_s: float  # warm switch right before the phase (0 when the GPUs already held the state)
    width_s: float  # duration it would have taken on its planned GPUs (= end - start when static)
    gpus: int  # GPUs it ran on at its start
    gpu_type: str
    busy_gpu_s: float = 0.0  # GPU-seconds of compute (lent GPUs included)
    switch_gpu_s: float = 0.0  # GPU-seconds spent loading state
    cluster: str = ""
    extra: dict = field(default_factory=dict)  # backend-specific columns of the record (elastic rollouts)


class Callbacks(Protocol):
    """What a backend calls on the controller."""

    def phase_done(self, run: PhaseRun, measured: Measured) -> None: ...
    def threshold_reached(self, run: PhaseRun) -> None: ...
    def sync_done(self, run: SyncRun, measured: Measured) -> None: ...
    def node_down(self, node: str) -> None: ...
    def node_up(self, node: str) -> None: ...


class Backend(Protocol):
    """Runs phases; the controller does not know which implementation it talks to."""

    def start(self) -> None: ...  # workers up, clock at 0 (the simulator: nothing to start)
    def stop(self) -> None: ...  # workers down, whatever happened (called from a finally)
    def attach(self, controller: Callbacks) -> None: ...
    def now(self) -> float: ...
    def call_at(self, time: float, fn: Callable[[], None]) -> None: ...
    def warm(self, run: PhaseRun, gpus: Sequence[str]) -> None: ...
    def permit(self, run: PhaseRun) -> None: ...
    def release(self, run: PhaseRun, gpus: Sequence[str], *, tail: bool = False) -> None: ...
    def abort(self, run: PhaseRun | SyncRun) -> None: ...
    def start_sync(self, run: SyncRun) -> None: ...
    def step(self) -> bool: ...  # wait for / simulate the next event; False when nothing is pending
    def idle(self) -> bool: ...  # nothing scheduled and nothing in flight: ``step`` would return False
