"""Typed messages between the controller process and its workers (pickled over multiprocessing pipes).

Controller -> worker: :class:`Warm`, :class:`Permit`, :class:`Unwarm`, :class:`Sync`, :class:`Stop`.
Worker -> controller: :class:`Ready`, :class:`Done`, :class:`Failed`, :class:`Cancelled`, :class:`SyncDone`.

Elastic rollouts: a ``Permit`` with ``task`` > 0 runs one prompt group (share ``shard`` of
``shards``) and keeps the rollout state on the device for the next one; the controller takes a group
back by writing its ``task`` to the worker's cancel cell (``Worker.cancel``), and the worker answers
``Cancelled`` (or ``Done``, when the group finished first).
Times are ``time.monotonic()`` seconds (one clock for every process on Linux); the backend turns
them into run time. ``attempt`` tells a re-run (after a worker died) from a late answer to the
attempt it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Group:
    """A torch.distributed group, built by its members on first use and kept while they live."""

    name: str  # names the members and their incarnations: a restarted member means a new group
    size: int
    rank: int


@dataclass(frozen=True)
class Warm:
    rid: int
    attempt: int
    job: str
    role: str  # rollout | train
    iteration: int
    version: int  # train: the state after train ``version``; rollout: policy of sync ``version`` (-1: initial)


@dataclass(frozen=True)
class Permit:
    rid: int
    attempt: int
    job: str
    role: str
    iteration: int
    version: int
    shard: int = 0
    shards: int = 1
    inputs: tuple[str, ...] = ()  # train: the iteration's rollout shard files
    group: Group | None = None  # train: the data-parallel group
    save: bool = False  # train: this worker writes the checkpoint
    sent: float = 0.0  # monotonic time of the permit (permit latency)
    task: int = 0  # > 0: one prompt group of an elastic rollout (cancellable; the state stays resident)


@dataclass(frozen=True)
class Unwarm:
    rid: int


@dataclass(frozen=True)
class Sync:
    sid: int
    attempt: int
    job: str
    iteration: int
    group: Group  # rank 0 sends
    load: bool  # install the weights here (a receiver, or a trainer that also rolls out)


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Ready:
    wid: int
    incarnation: int
    pid: int
    device: str


@dataclass(frozen=True)
class Done:
    rid: int
    attempt: int
    wid: int
    start: float  # compute start (after the warm switch)
    end: float
    switch_s: float  # to_device (+ restore) before, to_host after
    info: dict[str, Any] = field(default_factory=dict)  # tokens, count, ids, stats, path, loss, bytes
    task: int = 0  # the Permit's task (a prompt group of an elastic rollout)


@dataclass(frozen=True)
class Failed:
    rid: int  # a phase's rid, or a sync's sid when ``sync``
    attempt: int
    wid: int
    error: str
    sync: bool = False


@dataclass(frozen=True)
class Cancelled:
    """The prompt group of ``task`` was taken back before it finished: nothing of it was kept."""

    rid: int
    attempt: int
    wid: int
    task: int
    start: float
    end: float


@dataclass(frozen=True)
class SyncDone:
    sid: int
    attempt: int
    wid: int
    start: float
    end: float
    nbytes: int
