"""How the worker backend reaches its workers: the ``Transport`` interface and ``ProcessTransport``.

``WorkerBackend`` (``backend.py``) keeps every piece of bookkeeping (executions, attempts, prompt
groups, restarts, measured times); a transport only starts workers, carries messages and reports
deaths. Two implement it: ``ProcessTransport`` here (spawned processes on this machine, two pipes
each, a process sentinel for deaths, a shared heartbeat stamp and a shared cancel cell) and
``weave_rl.executor.ray_backend.transport.RayTransport`` (Ray actors in placement groups). The backend
names a worker by its wid (index in ``workers``); each transport keeps its own handle type, a
subclass of ``WorkerHandle``, whose common fields the backend reads and sets.

What comes back is a stream of events, handled one at a time as the transport yields them (so a
death's restart happens before the next message is read, as the order of arrival says): ``Reply``
(one message of a worker), ``Lost`` (the worker is gone: the transport has cleaned up its side, the
backend restarts it), ``Hung`` (its heartbeat is silent past the timeout; the transport kills it,
and its death follows as ``Lost``). Every time in a message that reaches the backend is on the
driver's ``time.monotonic()`` clock, and every time the backend sends is converted to the worker's
by the transport (a Ray actor on another node).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, Union

from weave_rl.executor.local import messages as m
from weave_rl.executor.local.worker import WorkerConfig, main as worker_main


# glibc returns large freed blocks to the OS (mmap), so every warm switch on a CPU "device" would
# page-fault its fresh buffers in again (4x slower than a copy). Workers keep freed memory instead,
# as a GPU's caching allocator does (bench.executor, section a).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024), "MALLOC_TRIM_THRESHOLD_": str(4 * 1024 ** 3)}


@contextlib.contextmanager
def worker_env():
    """The environment a spawned worker starts with (set around ``Process.start``)."""
    saved = {k: os.environ.get(k) for k in MALLOC_ENV}
    for k, v in MALLOC_ENV.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pick_device(devices: dict[str, str], pool: Sequence[str] | None = None) -> str:
    """The device of ``pool`` (default: those ``devices`` uses) with the fewest logical GPUs on it."""
    pool = sorted(set(pool or devices.values()))
    if not pool:
        from weave_rl.executor.local.devices import available_devices

        pool = available_devices()
    load = {d: 0 for d in pool}
    for d in devices.values():
        if d in load:
            load[d] += 1
    return min(pool, key=lambda d: (load[d], pool.index(d)))


class WorkerError(RuntimeError):
    """A worker failed in a way a restart does not explain (a bug in a workload, a missing file)."""


@dataclass
class WorkerHandle:
    """One incarnation of a logical GPU's worker: the fields the backend reads and sets (a transport's
    subclass adds how to reach it)."""

    wid: int
    gpu: str
    device: str
    incarnation: int = 0
    ready: bool = False
    restarts: int = 0
    late: bool = False  # spawned during the run (a GPU only a later plan uses)
    pid: int | None = None


@dataclass(frozen=True)
class Reply:
    wid: int
    incarnation: int
    msg: Any  # a messages.* reply, times on the driver's clock


@dataclass(frozen=True)
class Lost:
    wid: int
    incarnation: int
    code: int | str | None  # exit code (a process) or the first line of the error (an actor)


@dataclass(frozen=True)
class Hung:
    wid: int
    incarnation: int
    silent_s: float


Event = Union[Reply, Lost, Hung]
ConfigFn = Callable[[int, str, str], WorkerConfig]  # (wid, gpu, device) -> the first incarnation's config


class Transport(Protocol):
    """What differs between worker processes and Ray actors; the backend does the rest."""

    name: str  # metrics.json's backend

    @property
    def workers(self) -> Sequence[WorkerHandle]:
        """The current incarnation of every worker, by wid (the transport's own handle type)."""
        ...

    def worker_root(self, root: Path) -> Path:
        """The run folder as the workers see it (their config, the rendezvous store)."""
        ...

    def start(self, gpus: Mapping[str, str], config: ConfigFn, timeout_s: float) -> list[WorkerHandle]:
        """Start one worker per GPU of ``gpus`` (GPU -> device; the transport may choose it), wids in
        sorted GPU order, and wait until every one is ready (``WorkerError`` if one is not)."""
        ...

    def device_for(self, gpu: str, devices: Mapping[str, str]) -> str:
        """The device of a GPU that gets its worker during the run (``devices``: those in use)."""
        ...

    def spawn(self, cfg: WorkerConfig) -> WorkerHandle:
        """Start the worker ``cfg`` describes (a new incarnation of ``cfg.wid``, or the next wid); its
        ``Ready`` comes as a ``Reply``."""
        ...

    def send(self, wid: int, msg: Any, sync: bool = False) -> None:
        """A command (``Warm``/``Permit``/``Unwarm``, run in order) or a ``Sync`` (``sync``: beside the
        compute); lost silently when the worker is dead (its death reports, the restart re-sends)."""
        ...

    def cancel(self, wid: int, task: int) -> None:
        """Take back the prompt group ``task`` the worker computes (it checks between steps)."""
        ...

    def receive(self, timeout: float) -> Iterator[Event]:
        """Wait up to ``timeout`` s for replies and deaths; the events that came."""
        ...

    def check_heartbeats(self, timeout_s: float) -> Iterator[Event]:
        """``Hung`` for every worker silent past ``timeout_s`` (then killed), and what that kill reports."""
        ...

    def stop(self) -> None: ...

    def worker_rows(self) -> list[dict]:
        """``workers.json``: one row per worker (GPU, device, pid, incarnation and where it runs)."""
        ...

    def write_placement(self, root: Path) -> None:
        """Files describing where the workers run, beyond ``workers.json`` (``ray_placement.json``)."""
        ...


@dataclass
class ProcessWorker(WorkerHandle):
    proc: Any = None  # multiprocessing Process (spawn context)
    conn: Connection | None = None  # commands to the worker's main (compute) thread, and every reply
    sync_conn: Connection | None = None  # weight syncs, read by the worker's sync listener
    beat: Any = None  # shared double: the worker's last time.monotonic() stamp
    cancel: Any = None  # shared integer: the task of the prompt group taken back (worker.CancelCell)


class ProcessTransport:
    """One spawned process per logical GPU (``weave_rl.executor.local.worker.main``). Deaths show on
    the process sentinel at once; a hang (SIGSTOP, a wedged interpreter) does not, so every worker
    stamps a shared heartbeat and one silent too long is killed."""

    name = "local"

    def __init__(self, pool: Sequence[str] = ()):
        self.pool = sorted(set(pool))  # the devices a GPU of a later plan may go to
        self.ctx = mp.get_context("spawn")
        self.workers: list[ProcessWorker] = []

    def worker_root(self, root: Path) -> Path:
        return root

    def start(self, gpus: Mapping[str, str], config: ConfigFn, timeout_s: float) -> list[WorkerHandle]:
        for wid, gpu in enumerate(sorted(gpus)):
            self.spawn(config(wid, gpu, gpus[gpu]))
        deadline = time.monotonic() + timeout_s
        while not all(w.ready for w in self.workers):
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"workers did not start within {timeout_s:.0f} s")
            for obj in wait([w.conn for w in self.workers] + [w.proc.sentinel for w in self.workers], left):
                w = self._worker_of(obj)
                if obj is w.proc.sentinel:
                    raise WorkerError(f"worker for {w.gpu} ({w.device}) exited with code {w.proc.exitcode} "
                                      "while starting")
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    continue  # its sentinel says why
                if isinstance(msg, m.Failed):
                    raise WorkerError(f"worker for {w.gpu} ({w.device}) could not start:\n{msg.error.strip()}")
                if isinstance(msg, m.Ready) and msg.incarnation == w.incarnation:
                    w.ready, w.pid = True, msg.pid
        return list(self.workers)

    def device_for(self, gpu: str, devices: Mapping[str, str]) -> str:
        return devices.get(gpu) or pick_device(dict(devices), self.pool)

    def spawn(self, cfg: WorkerConfig) -> ProcessWorker:
        parent, child = self.ctx.Pipe()
        sync_child, sync_parent = self.ctx.Pipe(duplex=False)
        beat = self.ctx.Value("d", time.monotonic(), lock=False)  # the start counts as a stamp
        cancel = self.ctx.Value("q", 0, lock=False)
        proc = self.ctx.Process(target=worker_main, args=(cfg, child, sync_child, beat, cancel),
                                name=f"weave-worker-{cfg.wid}", daemon=True)
        with worker_env():
            proc.start()
        child.close()
        sync_child.close()
        w = ProcessWorker(cfg.wid, cfg.gpu, cfg.device, cfg.incarnation, pid=proc.pid, proc=proc, conn=parent,
                          sync_conn=sync_parent, beat=beat, cancel=cancel)
        install_worker(self.workers, w)
        return w

    def send(self, wid: int, msg: Any, sync: bool = False) -> None:
        w = self.workers[wid]
        try:
            (w.sync_conn if sync else w.conn).send(msg)
        except (OSError, BrokenPipeError):
            pass  # dead: its sentinel fires and the restart re-sends what it needs

    def cancel(self, wid: int, task: int) -> None:
        cell = self.workers[wid].cancel
        if cell is not None:
            cell.value = task

    def receive(self, timeout: float) -> Iterator[Event]:
        objs = [w.conn for w in self.workers] + [w.proc.sentinel for w in self.workers]
        for obj in wait(objs, timeout):
            w = self._worker_of(obj)  # None: a pipe of an incarnation restarted since the wait
            if w is None:
                continue
            if obj is w.proc.sentinel:
                w.proc.join(1)
                for conn in (w.conn, w.sync_conn):
                    try:
                        conn.close()
                    except OSError:
                        pass
                yield Lost(w.wid, w.incarnation, w.proc.exitcode)
                continue
            try:
                while w.conn.poll():
                    yield Reply(w.wid, w.incarnation, w.conn.recv())
            except (EOFError, OSError):
                pass  # its sentinel reports the death

    def check_heartbeats(self, timeout_s: float) -> Iterator[Event]:
        """The kill shows on the sentinel: ``receive`` then reports the death."""
        now = time.monotonic()
        for w in self.workers:
            if w.beat is None or not w.proc.is_alive():
                continue
            silent = now - w.beat.value
            if silent > timeout_s:
                yield Hung(w.wid, w.incarnation, silent)
                w.proc.kill()

    def stop(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(m.Stop())
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 10
        for w in self.workers:
            w.proc.join(max(0.1, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(5)

    def worker_rows(self) -> list[dict]:
        return [{"gpu": w.gpu, "device": w.device, "pid": w.proc.pid, "incarnation": w.incarnation}
                for w in self.workers]

    def write_placement(self, root: Path) -> None:
        return None  # one machine: workers.json says it all

    def _worker_of(self, obj) -> ProcessWorker | None:
        for w in self.workers:
            if obj is w.conn or obj is w.proc.sentinel:
                return w
        return None


def install_worker(workers: list, w: WorkerHandle) -> None:
    """``w`` in its wid's slot: a new incarnation replaces the old one, a new wid is appended."""
    if w.wid == len(workers):
        workers.append(w)
    else:
        workers[w.wid] = w
