"""``WorkerBackend``: the Backend protocol over one worker per logical GPU (DESIGN 5), whatever
carries the messages; ``LocalBackend`` is it over worker processes on this machine.

One worker per logical GPU of the plan (``weave_rl.executor.local.worker``), each on the device the
``--map`` gives it. How a worker is started, reached and declared dead is its ``Transport``
(``transport.py``): ``ProcessTransport`` (spawned processes, pipes, sentinels: the ``local``
backend) or ``RayTransport`` (actors: ``weave_rl.executor.ray_backend``). Everything else is here,
the same for both: executions and their attempts, results, elastic prompt groups, restarts and
re-runs, timers, measured times, job rows, events.

The controller's calls become messages: ``warm`` -> ``Warm`` (the worker loads the job's state at
once), ``permit`` -> ``Permit`` (it computes as soon as its switch is done), ``release``/``abort`` ->
``Unwarm`` (all commands, run in order by the worker's computing thread), ``start_sync`` -> ``Sync``
to the trainer (rank 0) and every rollout worker of the job (read beside the compute, even while
it computes). ``step()`` waits for the transport's events with a timeout that respects ``call_at``
timers; ``now()`` is seconds since the run started on the driver's clock.

Data: a rollout worker writes its shard to ``DIR/samples`` and reports ids, tokens and reward; the
train workers of that iteration get every shard's path and take their contiguous rows.

Faults: a worker that dies (``kill -9``, ``ray.kill``) is reported at once by its transport
(``Lost``: a process sentinel, a failed actor call), restarted (a new incarnation, hence new
torch.distributed groups), and everything it was part of is re-run *inside the backend*: a rollout
shard on the new worker (same prompts, same seeds, same policy version: the same samples,
overwriting the same file), a train gang on all its members (each restores the train state of the
previous iteration from ``DIR/checkpoints``, so the iteration's samples are trained on exactly
once), a weight sync on all its endpoints (a fresh trainer reads the policy checkpoint). The
controller only sees a slower phase; other jobs carry on. Choice: not the controller's
``node_down`` path, which on the one-node ``local`` topology would restart every job. A worker that
hangs (SIGSTOP, a wedged interpreter) is alive to its sentinel, so the transport also watches a
heartbeat (a shared stamp, a clock ping); one silent for ``heartbeat_timeout_s`` is killed (event
``worker_hung``), and its death takes the path above.

Plan switches (drift replanning): the controller drains the groups a new plan changes and installs
the new timetables at their cycle boundary; the backend needs no notice of it. A job that moves
gets its state on its new workers from what the old ones left: a train worker whose host copy is not
the version asked for restores ``DIR/checkpoints/<job>/train-<k>.pt`` (state and ledger of consumed
sample ids, written by rank 0 after every train phase, so nothing is lost or trained twice), a
rollout worker loads the policy checkpoint of the job's latest sync; new gangs get new
torch.distributed groups (a group's name lists its members). A GPU of the new plan that has no
worker yet gets one when the plan is asked for (``prepare``) or on first use (``_wid``), on the
device its transport picks (the least-loaded one of this run: ``pick_device``); it serves its first
job once its cold start is over (its commands wait for it).
"""

from __future__ import annotations

import contextlib
import heapq
from collections import deque
import itertools
import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from weave_rl.executor.backend import Callbacks, Measured, PhaseRun, SyncRun
from weave_rl.executor.local import messages as m
from weave_rl.executor.local.transport import (MALLOC_ENV, Event, Hung, Lost, ProcessTransport, Reply, Transport,
                                               WorkerError, WorkerHandle, pick_device, worker_env)
from weave_rl.executor.local.worker import WorkerConfig
from weave_rl.executor.prompt_groups import pulled_schedule
from weave_rl.profiles.jobs import JobSet
from weave_rl.topology.topology import Topology, node_of

__all__ = ["LocalBackend", "MALLOC_ENV", "WorkerBackend", "WorkerError", "drop_rendezvous", "make_rendezvous",
           "pick_device", "worker_env"]


def make_rendezvous(root: Path) -> str:
    """A fresh FileStore path for the run's torch.distributed groups, in a folder only its owner can
    enter (comm.py: the rendezvous needs no listener and no shared secret on the wire)."""
    folder = Path(root) / ".rendezvous"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return str(folder / f"store-{secrets.token_hex(8)}")


def drop_rendezvous(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


@dataclass(eq=False)
class _Exec:
    run: PhaseRun
    rid: int
    warmed: set[str] = field(default_factory=set)
    attempt: dict[str, int] = field(default_factory=dict)
    permitted: bool = False
    permit_sent: float = 0.0
    results: dict[str, m.Done] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    # An elastic rollout: its prompt groups (shares), pulled one at a time by the GPUs it holds.
    todo: deque[int] = field(default_factory=deque)  # shares not started (a taken-back one goes first)
    tasks: dict[str, tuple[int, int]] = field(default_factory=dict)  # GPU -> (share, task) computing
    taking_back: dict[int, tuple[str, int]] = field(default_factory=dict)  # task -> (GPU, share) cancelled
    shares_done: dict[int, m.Done] = field(default_factory=dict)
    threshold_told: bool = False
    gpus_at_start: int = 0
    peak_gpus: int = 0
    taken_back: int = 0  # prompt groups regenerated elsewhere (migration, a loan ended, a dead worker)
    wasted_gpu_s: float = 0.0  # compute thrown away with them


@dataclass(eq=False)
class _SyncExec:
    run: SyncRun
    sid: int
    start: float
    members: list[int]  # wids, rank order (0 sends)
    loads: set[int]
    attempt: int = 0
    results: dict[int, m.SyncDone] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


class WorkerBackend:
    """The bookkeeping of a run over workers; ``transport`` starts and reaches them (default: a
    ``ProcessTransport`` over the devices of ``devices``)."""

    def __init__(self, topology: Topology, jobs: JobSet, devices: dict[str, str], root: Path, *, seed: int = 0,
                 threads: int = 1, offsets: dict[str, int] | None = None, clock_start: float = 0.0,
                 pin_cores: bool = True, max_restarts: int = 5, start_timeout_s: float = 180.0,
                 gpu_jobs: dict[str, set[str]] | None = None, heartbeat_timeout_s: float = 10.0,
                 transport: Transport | None = None):
        self.topology = topology
        self.specs = {j.name: j for j in jobs.jobs}
        self.devices = dict(devices)  # logical GPU -> device
        # A GPU of a later plan goes to the least-loaded device of this run.
        self.transport: Transport = transport or ProcessTransport(sorted(set(self.devices.values())))
        self.name = self.transport.name  # metrics.json's backend
        self.root = Path(root)
        self.threads = threads
        self.offsets = dict(offsets or {})
        self.pin_cores = pin_cores
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.blocks = {j.name: (j.workload, seed * 1000 + i) for i, j in enumerate(jobs.jobs)}
        self.gpu_jobs = {g: set(js) for g, js in (gpu_jobs or {}).items()}  # built before a worker is ready
        self.synced = {j: self.offsets.get(j, 0) - 1 for j in self.specs}  # real iteration of the last sync
        self.clock_start = clock_start
        self.t0 = time.monotonic() - clock_start
        self.controller: Callbacks | None = None
        self.wid_of: dict[str, int] = {}
        self.execs: dict[int, _Exec] = {}
        self.by_run: dict[PhaseRun, _Exec] = {}
        self.syncs: dict[int, _SyncExec] = {}
        self.by_sync: dict[SyncRun, _SyncExec] = {}
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count(1)
        self.sample_paths: dict[tuple[str, int], list[str]] = {}
        self.tokens: dict[tuple[str, int], int] = {}  # (job, controller iteration) -> rollout tokens
        self.job_rows: dict[tuple[str, int], dict] = {}  # (job, real iteration) -> reward, loss, ...
        self.permit_latency_s: list[float] = []
        self.permit_latency_by_phase: dict[str, list[float]] = {}
        self.events: list[dict] = []
        self.on_metric: list[Callable[[dict], None]] = []
        self.rendezvous: str | None = None  # FileStore path (comm.Groups)
        self.worker_root = str(self.root)  # the run folder as the workers see it

    @property
    def workers(self) -> Sequence[WorkerHandle]:
        """The current incarnation of every worker, by wid (the transport's handles)."""
        return self.transport.workers

    # ----- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start one worker per logical GPU and wait until all are up; the clock starts then."""
        root = self.transport.worker_root(self.root)
        self.worker_root = str(root)
        self.rendezvous = make_rendezvous(root)
        for w in self.transport.start(self.devices, self._config, self.start_timeout_s):
            self.wid_of[w.gpu] = w.wid
            self.devices[w.gpu] = w.device  # the transport may have chosen it (Ray: per node)
        self.t0 = time.monotonic() - self.clock_start
        self._write_workers()
        self.transport.write_placement(self.root)

    def stop(self) -> None:
        self.transport.stop()
        drop_rendezvous(self.rendezvous)

    def _config(self, wid: int, gpu: str, device: str, incarnation: int = 0) -> WorkerConfig:
        return WorkerConfig(wid, incarnation, gpu, device, self.threads, self.rendezvous, self.worker_root,
                            self.blocks, self.pin_cores, tuple(sorted(self.gpu_jobs.get(gpu, ()))))

    def _write_workers(self) -> None:
        tmp = self.root / ".workers.json.tmp"
        tmp.write_text(json.dumps(self.transport.worker_rows(), indent=1))
        os.replace(tmp, self.root / "workers.json")

    # ----- Backend protocol ---------------------------------------------------------------------
    def attach(self, controller: Callbacks) -> None:
        self.controller = controller

    def now(self) -> float:
        return time.monotonic() - self.t0

    def call_at(self, time_s: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.timers, (time_s, next(self._ids), fn))

    def warm(self, run: PhaseRun, gpus: Sequence[str]) -> None:
        ex = self._exec(run)
        for g in gpus:
            ex.warmed.add(g)
            ex.attempt.setdefault(g, 0)
            self._send_warm(ex, g)
            if ex.permitted and run.elastic:  # a GPU joins a running rollout: it pulls after its switch
                self._pull(ex, g)

    def permit(self, run: PhaseRun) -> None:
        ex = self._exec(run)
        ex.permitted = True
        ex.permit_sent = time.monotonic()
        ex.gpus_at_start = len(ex.warmed)
        for g in sorted(ex.warmed):
            if run.elastic:
                self._pull(ex, g)
            else:
                self._send_permit(ex, g)

    def release(self, run: PhaseRun, gpus: Sequence[str], *, tail: bool = False) -> None:
        """GPUs leave ``run``: unwarmed before it starts; once it runs (an elastic rollout: long-tail
        migration, or a loan taken back) the prompt group a GPU computes is taken back, and goes to
        the GPUs that stay when the worker confirms (or is kept, when it finished first)."""
        ex = self.by_run.get(run)
        if ex is None:
            return
        if ex.permitted and not run.elastic:
            raise WorkerError(f"{run.phase} of {run.job}: a gang phase cannot give GPUs back while it runs")
        for g in gpus:
            ex.warmed.discard(g)
            if g in ex.tasks:
                share, task = ex.tasks.pop(g)
                ex.taking_back[task] = (g, share)
                self._cancel(self._wid(g), task)
            self._send(self._wid(g), m.Unwarm(ex.rid))
        self._show_progress(ex)

    def abort(self, run: PhaseRun | SyncRun) -> None:
        if isinstance(run, SyncRun):
            sx = self.by_sync.pop(run, None)
            if sx is not None:
                self.syncs.pop(sx.sid, None)
            return
        ex = self.by_run.pop(run, None)
        if ex is None:
            return
        self.execs.pop(ex.rid, None)
        for g, (_, task) in ex.tasks.items():
            self._cancel(self._wid(g), task)
        for g in ex.warmed:
            self._send(self._wid(g), m.Unwarm(ex.rid))

    # ----- elastic rollouts: prompt groups pulled by the GPUs a run holds ------------------------
    def _pull(self, ex: _Exec, g: str) -> None:
        """``g`` (warmed for ``ex``, idle) starts the next prompt group, if one is left."""
        if not ex.permitted or g not in ex.warmed or g in ex.tasks or not ex.todo:
            return
        run = ex.run
        share, task = ex.todo.popleft(), next(self._ids)
        ex.tasks[g] = (share, task)
        ex.peak_gpus = max(ex.peak_gpus, len(ex.tasks))
        wid = self._wid(g, run.job)
        sent = time.monotonic() if self.workers[wid].ready else 0.0
        self._send(wid, m.Permit(ex.rid, ex.attempt[g], run.job, run.phase, self._real(run.job, run.iteration),
                                 self._version(run), shard=share, shards=run.shares, sent=sent, task=task))
        self._show_progress(ex)

    def _show_progress(self, ex: _Exec) -> None:
        ex.run.pending = len(ex.todo)
        ex.run.computing = set(ex.tasks)

    def _give_back(self, ex: _Exec, share: int, wasted_s: float) -> None:
        """A prompt group that did not finish goes to the front of the queue, for a GPU that stays."""
        ex.todo.appendleft(share)
        ex.taken_back += 1
        ex.wasted_gpu_s += max(0.0, wasted_s)
        for g in sorted(ex.warmed):
            self._pull(ex, g)
        self._show_progress(ex)

    def _share_done(self, ex: _Exec, g: str, msg: m.Done) -> None:
        if msg.task in ex.taking_back:  # it finished before the take-back reached it: kept
            _, share = ex.taking_back.pop(msg.task)
        elif ex.tasks.get(g, (None, None))[1] == msg.task:
            share, _ = ex.tasks.pop(g)
        else:
            return  # an answer to a task a restart replaced
        ex.shares_done[share] = msg
        self._pull(ex, g)
        self._show_progress(ex)
        run = ex.run
        done = len(ex.shares_done)
        if (run.watch_threshold is not None and not ex.threshold_told and done < run.shares
                and done >= math.ceil(run.watch_threshold * run.shares - 1e-9)):
            ex.threshold_told = True
            self.controller.threshold_reached(run)  # may release GPUs of this run (the tail moves)
        if done == run.shares and self.by_run.get(run) is ex:
            for gpu in sorted(ex.warmed):  # the state leaves the device now, not at the next warm
                self._send(self._wid(gpu), m.Unwarm(ex.rid))
            self._finish(ex)

    def _share_cancelled(self, ex: _Exec, g: str, msg: m.Cancelled) -> None:
        if msg.task in ex.taking_back:
            _, share = ex.taking_back.pop(msg.task)
        elif ex.tasks.get(g, (None, None))[1] == msg.task:  # cancelled without being asked (a late cell)
            share, _ = ex.tasks.pop(g)
        else:
            return
        self._give_back(ex, share, msg.end - msg.start)

    def _cancel(self, wid: int, task: int) -> None:
        """Tell worker ``wid`` to drop the prompt group ``task``."""
        self.transport.cancel(wid, task)

    def start_sync(self, run: SyncRun) -> None:
        sender = self._wid(run.train_gpus[0], run.job)
        receivers = sorted({self._wid(g, run.job) for g in run.rollout_gpus})
        members = [sender] + [r for r in receivers if r != sender]
        sx = _SyncExec(run, next(self._ids), self.now(), members, set(receivers))
        self.syncs[sx.sid] = sx
        self.by_sync[run] = sx
        self._send_sync(sx)

    def _wait_budget(self) -> float | None:
        """Seconds ``step`` may wait for a report (up to 1 s, less before the next timer), or None
        when nothing can report: the controller waits for nothing."""
        if not (any(ex.permitted for ex in self.execs.values()) or self.syncs or self.timers):
            return None
        if self.timers:
            return max(0.0, min(1.0, self.timers[0][0] - self.now()))
        return 1.0

    def idle(self) -> bool:
        return self._wait_budget() is None

    def step(self) -> bool:
        for ev in self.transport.check_heartbeats(self.heartbeat_timeout_s):
            self._on(ev)
        if self._fire_timers():
            return True
        timeout = self._wait_budget()
        if timeout is None:
            return False
        for ev in self.transport.receive(timeout):  # one at a time: a restart before the next message
            self._on(ev)
        return True

    def _on(self, ev: Event) -> None:
        w = self.workers[ev.wid]
        if ev.incarnation != w.incarnation:
            return  # from an incarnation restarted since: its re-run replaces what it did
        if isinstance(ev, Reply):
            self._handle(ev.msg)
        elif isinstance(ev, Hung):  # the transport kills it; its death comes as Lost
            self.events.append({"t": self.now(), "event": "worker_hung", "gpu": w.gpu, "pid": w.pid,
                                "incarnation": w.incarnation, "silent_s": round(ev.silent_s, 3)})
        elif isinstance(ev, Lost):
            self._died(ev.wid, ev.code)

    def prepare(self, gpu_jobs: dict[str, set[str]]) -> None:
        """Start a worker now for each GPU of ``gpu_jobs`` that has none (a plan was asked for: the cold
        start overlaps the drain of the groups it changes), building the jobs it will serve."""
        for g in sorted(gpu_jobs):
            if g not in self.wid_of:
                self.gpu_jobs.setdefault(g, set()).update(gpu_jobs[g])
                self._wid(g)

    def forget_stale(self, live: Sequence[PhaseRun]) -> None:
        """Unwarm phases the controller dropped without a release (a plan switch's drained runs)."""
        keep = set(map(id, live))
        for run, ex in list(self.by_run.items()):
            if ex.permitted or id(run) in keep:
                continue
            del self.by_run[run]
            self.execs.pop(ex.rid, None)
            for g in ex.warmed:
                self._send(self._wid(g), m.Unwarm(ex.rid))

    # ----- sending ------------------------------------------------------------------------------
    def _wid(self, gpu: str, job: str | None = None) -> int:
        """The worker of ``gpu``; a GPU without one (a later plan's) gets one now, built for ``job``."""
        wid = self.wid_of.get(gpu)
        if wid is not None:
            return wid
        device = self.transport.device_for(gpu, self.devices)
        self.devices[gpu] = device
        if job is not None:
            self.gpu_jobs.setdefault(gpu, set()).add(job)
        wid = len(self.workers)
        self.wid_of[gpu] = wid
        w = self.transport.spawn(self._config(wid, gpu, device))
        w.late = True
        self.events.append({"t": self.now(), "event": "worker_started", "gpu": gpu, "device": device,
                            "pid": w.pid, "jobs": sorted(self.gpu_jobs.get(gpu, ()))})
        self._write_workers()
        self.transport.write_placement(self.root)
        return wid

    def _exec(self, run: PhaseRun) -> _Exec:
        ex = self.by_run.get(run)
        if ex is None:
            ex = _Exec(run, next(self._ids))
            if run.elastic:
                ex.todo = deque(range(run.shares))
                self._show_progress(ex)
            self.by_run[run] = ex
            self.execs[ex.rid] = ex
        return ex

    def _real(self, job: str, iteration: int) -> int:
        return iteration + self.offsets.get(job, 0)

    def _version(self, run: PhaseRun) -> int:
        k = self._real(run.job, run.iteration)
        return k - 1 if run.phase == "train" else self.synced[run.job]

    def _send(self, wid: int, msg, sync: bool = False) -> None:
        self.transport.send(wid, msg, sync)

    def _send_warm(self, ex: _Exec, g: str) -> None:
        run = ex.run
        self._send(self._wid(g, run.job), m.Warm(ex.rid, ex.attempt[g], run.job, run.phase,
                                          self._real(run.job, run.iteration), self._version(run)))

    def _send_permit(self, ex: _Exec, g: str) -> None:
        run = ex.run
        k = self._real(run.job, run.iteration)
        index = run.gpus.index(g)
        group, inputs = None, ()
        if run.phase == "train":
            members = [self.workers[self._wid(x, run.job)] for x in run.gpus]
            name = f"train/{run.job}/" + ",".join(f"{w.wid}.{w.incarnation}" for w in members)
            group = m.Group(name, len(members), index)
            inputs = tuple(self.sample_paths.get((run.job, k), ()))
            if not inputs:
                raise WorkerError(f"train {run.job} iteration {k}: no rollout samples")
        wid = self._wid(g, run.job)
        # A worker still in its cold start (a GPU a new plan brought in) would count its start-up as latency.
        sent = time.monotonic() if self.workers[wid].ready else 0.0
        self._send(wid, m.Permit(ex.rid, ex.attempt[g], run.job, run.phase, k, self._version(run),
                                 shard=index, shards=len(run.gpus), inputs=inputs, group=group,
                                 save=index == 0, sent=sent))

    def _send_sync(self, sx: _SyncExec) -> None:
        ws = [self.workers[w] for w in sx.members]
        name = (f"sync/{sx.run.job}/{sx.attempt}/" + ",".join(f"{w.wid}.{w.incarnation}" for w in ws))
        k = self._real(sx.run.job, sx.run.iteration)
        for rank, w in enumerate(ws):
            self._send(w.wid, sync=True, msg=m.Sync(sx.sid, sx.attempt, sx.run.job, k, m.Group(name, len(ws), rank),
                                     load=w.wid in sx.loads))

    # ----- receiving ----------------------------------------------------------------------------
    def _handle(self, msg) -> None:
        if isinstance(msg, m.Ready):
            w = self.workers[msg.wid]
            if msg.incarnation == w.incarnation:
                w.ready, w.pid = True, msg.pid
                if w.incarnation > 0 or w.late:
                    self.events.append({"t": self.now(), "event": "worker_up", "gpu": w.gpu, "pid": msg.pid,
                                        "incarnation": w.incarnation})
                    self._write_workers()
        elif isinstance(msg, m.Cancelled):
            ex = self.execs.get(msg.rid)
            g = self.workers[msg.wid].gpu
            if ex is not None and ex.attempt.get(g) == msg.attempt:
                self._share_cancelled(ex, g, msg)
        elif isinstance(msg, m.Done) and msg.task:
            ex = self.execs.get(msg.rid)
            g = self.workers[msg.wid].gpu
            if ex is not None and ex.attempt.get(g) == msg.attempt:
                if msg.info.get("permit_latency_s") is not None:
                    self.permit_latency_s.append(msg.info["permit_latency_s"])
                    self.permit_latency_by_phase.setdefault("rollout", []).append(msg.info["permit_latency_s"])
                self._share_done(ex, g, msg)
        elif isinstance(msg, m.Done):
            ex = self.execs.get(msg.rid)
            g = self.workers[msg.wid].gpu
            if ex is None or ex.attempt.get(g) != msg.attempt or g not in ex.warmed:
                return  # aborted, or an attempt a restart replaced
            ex.results[g] = msg
            if msg.info.get("permit_latency_s") is not None:
                self.permit_latency_s.append(msg.info["permit_latency_s"])
                self.permit_latency_by_phase.setdefault(ex.run.phase, []).append(msg.info["permit_latency_s"])
            self._check_phase(ex)
        elif isinstance(msg, m.Failed) and not msg.sync and msg.rid == -1:
            w = self.workers[msg.wid]
            raise WorkerError(f"worker for {w.gpu} ({w.device}) could not start:\n{msg.error.strip()}")
        elif isinstance(msg, m.Failed) and not msg.sync:
            ex = self.execs.get(msg.rid)
            g = self.workers[msg.wid].gpu
            if ex is None or ex.attempt.get(g) != msg.attempt:
                return
            ex.failed[g] = msg.error
            self._check_phase(ex)
        elif isinstance(msg, m.Failed):
            sx = self.syncs.get(msg.rid)
            if sx is None or sx.attempt != msg.attempt:
                return
            sx.failed[msg.wid] = msg.error
            self._check_sync(sx)
        elif isinstance(msg, m.SyncDone):
            sx = self.syncs.get(msg.sid)
            if sx is None or sx.attempt != msg.attempt:
                return
            sx.results[msg.wid] = msg
            self._check_sync(sx)

    def _check_phase(self, ex: _Exec) -> None:
        run = ex.run
        need = set(ex.warmed)
        if run.elastic and not ex.failed:
            return  # its prompt groups report one by one (_share_done)
        if not run.elastic and (not ex.permitted or need - set(ex.results) - set(ex.failed)):
            return
        if ex.failed:
            g, error = next(iter(sorted(ex.failed.items())))
            k = self._real(run.job, run.iteration)
            self.events.append({"t": self.now(), "event": "phase_failed", "job": run.job, "phase": run.phase,
                                "iteration": k, "gpu": g, "error": error.strip()[-4000:]})
            raise WorkerError(f"{run.phase} of {run.job} iteration {k} failed on {g}:\n{error}")
        self._finish(ex)

    def _finish(self, ex: _Exec) -> None:
        run = ex.run
        if run.elastic:
            res = [ex.shares_done[s] for s in sorted(ex.shares_done)]
        else:
            res = [ex.results[g] for g in sorted(ex.results)]
        start = min(r.start for r in res) - self.t0
        end = max(r.end for r in res) - self.t0
        k = self._real(run.job, run.iteration)
        row = self.job_rows.setdefault((run.job, k), {"job": run.job, "iteration": k})
        if run.phase == "rollout":
            paths = sorted((r.info["path"] for r in res), key=lambda p: int(Path(p).stem.split("-")[1]))
            self.sample_paths[(run.job, k)] = paths
            tokens = sum(r.info["tokens"] for r in res)
            count = sum(r.info["count"] for r in res)
            self.tokens[(run.job, run.iteration)] = tokens
            for key in sorted({s for r in res for s in r.info["stats"]}):
                vals = [(r.info["stats"][key], r.info["count"]) for r in res if key in r.info["stats"]]
                row[key] = sum(v * c for v, c in vals) / max(1, sum(c for _, c in vals))
            row.update({"samples": count, "tokens": tokens, "rollout_s": end - start})
        else:
            for key in sorted({s for r in res for s in r.info["metrics"]}):
                vals = [r.info["metrics"][key] for r in res if key in r.info["metrics"]]
                row.setdefault(f"train_{key}" if key in row else key, sum(vals) / len(vals))
            row.update({"trained_samples": sum(r.info["count"] for r in res), "ledger": res[0].info["ledger"],
                        "ledger_unique": res[0].info["ledger_unique"], "train_s": end - start})
            for hook in self.on_metric:
                hook(dict(row))
        busy = sum(r.end - r.start for r in res)
        # per planned GPU, what the phase held its devices for after its work (worker.py: after_s)
        after = max(r.info.get("after_s", 0.0) for r in res)
        width, extra = end - start, {}
        if run.elastic:
            # What the same prompt groups would take pulled by the planned GPUs alone: the duration a
            # profile refit should see, whatever was lent or migrated (prompt_groups.py).
            shape = pulled_schedule([r.end - r.start for r in res], len(run.gpus), run.watch_threshold or 0.8)
            width = shape.makespan_s
            extra = {"shares": run.shares, "tail_share": shape.tail_share, "gpus_peak": ex.peak_gpus,
                     "shares_taken_back": ex.taken_back, "wasted_gpu_s": ex.wasted_gpu_s,
                     "share_s_max": max(r.end - r.start for r in res), "share_s_mean": busy / len(res)}
            after = sum(r.info.get("after_s", 0.0) for r in res) / len(run.gpus)
            busy += ex.wasted_gpu_s
        m_ = Measured(start_s=start, end_s=end, switch_s=max(r.switch_s for r in res), width_s=width,
                      gpus=ex.gpus_at_start if run.elastic else len(res), gpu_type=run.gpu_type, busy_gpu_s=busy,
                      switch_gpu_s=sum(r.switch_s for r in res),
                      cluster=self.topology.node(node_of(run.gpus[0])).cluster, extra={**extra, "after_s": after})
        self.by_run.pop(run, None)
        self.execs.pop(ex.rid, None)
        self.controller.phase_done(run, m_)

    def _check_sync(self, sx: _SyncExec) -> None:
        if set(sx.members) - set(sx.results) - set(sx.failed):
            return
        if sx.failed:
            wid, error = next(iter(sorted(sx.failed.items())))
            raise WorkerError(f"weight sync of {sx.run.job} failed on {self.workers[wid].gpu}:\n{error}")
        self.syncs.pop(sx.sid, None)
        self.by_sync.pop(sx.run, None)
        run = sx.run
        end = max(r.end for r in sx.results.values()) - self.t0
        self.synced[run.job] = max(self.synced[run.job], self._real(run.job, run.iteration))
        nbytes = max(r.nbytes for r in sx.results.values())
        row = self.job_rows.setdefault((run.job, self._real(run.job, run.iteration)),
                                       {"job": run.job, "iteration": self._real(run.job, run.iteration)})
        row.update({"sync_s": end - sx.start, "sync_bytes": nbytes})
        m_ = Measured(start_s=sx.start, end_s=end, switch_s=0.0, width_s=end - sx.start, gpus=len(run.rollout_gpus),
                      gpu_type=self.topology.gpu_type_of(run.rollout_gpus[0]),
                      cluster=self.topology.node(node_of(run.rollout_gpus[0])).cluster)
        self.controller.sync_done(run, m_)

    def _fire_timers(self) -> bool:
        fired = False
        while self.timers and self.timers[0][0] <= self.now():
            _, _, fn = heapq.heappop(self.timers)
            fn()
            fired = True
        return fired

    # ----- faults -------------------------------------------------------------------------------
    def _died(self, wid: int, code: int | str | None) -> None:
        """Worker ``wid`` is gone (``code``: its exit code, or why): a new incarnation, and a re-run of
        what it was part of."""
        w = self.workers[wid]
        w.restarts += 1
        if w.restarts > self.max_restarts:
            raise WorkerError(f"worker for {w.gpu} died {w.restarts} times (last exit code {code})")
        lost = []
        new = self.transport.spawn(self._config(wid, w.gpu, w.device, w.incarnation + 1))
        new.restarts = w.restarts
        for ex in list(self.execs.values()):
            if ex.run.elastic:
                if self._lost_shares(ex, w.gpu):
                    lost.append(f"{ex.run.job}/rollout/{self._real(ex.run.job, ex.run.iteration)}")
                continue
            if w.gpu not in ex.warmed:
                continue
            run = ex.run
            lost.append(f"{run.job}/{run.phase}/{self._real(run.job, run.iteration)}")
            gang = ex.permitted and run.phase == "train"
            if not gang and w.gpu in ex.results:
                continue  # its rollout shard was done and reported (the samples are on disk)
            again = sorted(ex.warmed) if gang else [w.gpu]
            for g in again:  # a gang re-runs together; a rollout shard alone
                ex.attempt[g] = ex.attempt.get(g, 0) + 1
                ex.results.pop(g, None)
                ex.failed.pop(g, None)
                self._send_warm(ex, g)
                if ex.permitted:
                    self._send_permit(ex, g)
        for sx in list(self.syncs.values()):
            if w.wid in sx.members:
                lost.append(f"{sx.run.job}/sync/{self._real(sx.run.job, sx.run.iteration)}")
                sx.attempt += 1
                sx.results.clear()
                sx.failed.clear()
                self._send_sync(sx)
        self.events.append({"t": self.now(), "event": "worker_died", "gpu": w.gpu, "exit_code": code,
                            "incarnation": w.incarnation, "rerun": lost})
        self._write_workers()

    def _lost_shares(self, ex: _Exec, g: str) -> bool:
        """A dead worker's prompt groups of an elastic rollout: the one it computed (or was giving
        back) goes to the queue; a GPU the run still holds warms again and pulls. Groups it finished
        were reported with their samples on disk and stay done."""
        lost = [share for gpu, (share, _) in ex.tasks.items() if gpu == g]
        lost += [share for task, (gpu, share) in list(ex.taking_back.items()) if gpu == g]
        ex.tasks.pop(g, None)
        for task in [t for t, (gpu, _) in ex.taking_back.items() if gpu == g]:
            del ex.taking_back[task]
        if g in ex.warmed:
            ex.attempt[g] = ex.attempt.get(g, 0) + 1
            self._send_warm(ex, g)
        for share in sorted(lost, reverse=True):
            self._give_back(ex, share, 0.0)  # its work is lost with the process (not measured)
        if g in ex.warmed and ex.permitted:
            self._pull(ex, g)
        return bool(lost) or g in ex.warmed

    # ----- figures ------------------------------------------------------------------------------
    def permit_latency(self) -> dict:
        """p50 / p99 / max of permit -> compute start, in ms, over all phases and per phase."""
        out = _percentiles(self.permit_latency_s)
        out["by_phase"] = {p: _percentiles(xs) for p, xs in sorted(self.permit_latency_by_phase.items())}
        return out


def _percentiles(values: list[float]) -> dict:
    xs = sorted(values)
    if not xs:
        return {"p50_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan, "n": 0}
    pick = lambda q: xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]  # noqa: E731
    return {"p50_ms": 1e3 * pick(0.5), "p99_ms": 1e3 * pick(0.99), "max_ms": 1e3 * xs[-1], "n": len(xs)}


LocalBackend = WorkerBackend  # over worker processes (its default transport); the name the local run uses
