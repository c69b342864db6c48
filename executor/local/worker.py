"""A worker process of the local backend: one logical GPU, the phase shim, weight-sync receiver.

Threads: the main thread reads the controller's command pipe and runs warm switches and phases in
arrival order (``Warm`` -> ``Permit`` -> done, ``Unwarm``); a listener thread reads the sync pipe and
gives each ``Sync`` a short thread of its own, so a weight sync lands in this worker's host cache (``load_policy_weights``)
even while it computes another job's phase. A per-job lock keeps a sync and a phase of the same job
apart.

State: one ``Workload`` per job (built on first use), the host copy of each (job, role) and its
version (train: iterations trained; rollout: the sync its weights come from, -1 = initial), and per
job the ledger of sample ids its train state has consumed. A phase warm-loads its state from the
host copy (``to_device``; first restoring ``DIR/checkpoints`` when the version is not the one the
controller asks for, e.g. in a fresh worker after a crash), runs, and offloads (``to_host``). The
rank-0 train worker checkpoints the train state (with its ledger) and the policy weights after every
train phase, before it reports the phase done.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

KEEP_CHECKPOINTS = 3
HEARTBEAT_S = 0.25  # how often a worker stamps its heartbeat (the controller's timeout is far longer)


@dataclass(frozen=True)
class WorkerConfig:
    wid: int
    incarnation: int
    gpu: str  # the logical GPU id of the plan
    device: str  # cpu:N | cuda:N
    threads: int
    rendezvous: str  # the FileStore of the run's torch.distributed groups (comm.Groups)
    root: str  # the run's output folder (samples, checkpoints)
    jobs: dict[str, tuple[dict | None, int]]  # job -> (workload block, seed)
    pin_core: bool = True
    prebuild: tuple[str, ...] = ()  # jobs this GPU serves: their Workloads are built before Ready (cold start)
    bind_host: str = "127.0.0.1"  # where gloo listens ("": this machine's default interface)


def checkpoint_path(root: Path, job: str, kind: str, k: int) -> Path:
    return root / "checkpoints" / job / f"{kind}-{k}.pt"


def start_heartbeat(beat) -> None:
    """Stamp ``beat`` (a shared double) with ``time.monotonic()`` every ``HEARTBEAT_S`` from a thread
    of its own: a stopped process (SIGSTOP) or one whose interpreter is wedged stops stamping, and the
    controller kills and restarts it (``ProcessTransport.check_heartbeats``)."""

    def stamp() -> None:
        while True:
            beat.value = time.monotonic()
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=stamp, name="heartbeat", daemon=True).start()


class CancelCell:
    """Where the controller writes the task id of the prompt group it takes back (a shared integer
    for a process worker; the Ray actor sets ``value`` from a concurrent call)."""

    def __init__(self) -> None:
        self.value = 0


def main(cfg: WorkerConfig, conn: Connection, sync_conn: Connection, beat=None, cancel=None) -> None:
    """Process entry point (spawned)."""
    if beat is not None:
        start_heartbeat(beat)
    import torch

    sys.setswitchinterval(0.0005)  # a sync thread must not hold the GIL for 5 ms while a permit waits
    torch.set_num_threads(cfg.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    kind, _, index = cfg.device.partition(":")
    if kind == "cpu" and cfg.pin_core and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if cores:
            os.sched_setaffinity(0, {cores[int(index or 0) % len(cores)]})
    if kind == "cuda":
        torch.cuda.set_device(int(index or 0))
    Worker(cfg, conn, sync_conn, cancel).serve()


class Worker:
    def __init__(self, cfg: WorkerConfig, conn: Connection, sync_conn: Connection, cancel=None):
        import torch

        from weave_rl.executor.local.comm import Groups

        self.cfg = cfg
        self.conn = conn
        self.sync_conn = sync_conn
        self.root = Path(cfg.root)
        kind, _, index = cfg.device.partition(":")
        self.device = torch.device("cuda", int(index or 0)) if kind == "cuda" else torch.device("cpu")
        self.groups = Groups(cfg.rendezvous, cfg.bind_host, self.device)
        self.send_lock = threading.Lock()
        self.build_lock = threading.Lock()
        self.locks: dict[str, threading.RLock] = {j: threading.RLock() for j in cfg.jobs}
        self.workloads: dict[str, Any] = {}
        self.host: dict[tuple[str, str], dict] = {}
        self.version: dict[tuple[str, str], int] = {}
        self.ledger: dict[str, list[str]] = {}
        self.latest: dict[str, tuple[int, dict]] = {}  # job -> (iteration, policy weights) after train
        self.resident: tuple[str, str, int] | None = None  # (job, role, rid) on the device
        self.warmed: dict[int, tuple[int, float]] = {}  # rid -> (attempt, switch seconds)
        self.cancel = cancel if cancel is not None else CancelCell()  # .value: the task taken back

    # ----- plumbing ---------------------------------------------------------------------------
    def send(self, msg) -> None:
        with self.send_lock:
            try:
                self.conn.send(msg)
            except (OSError, EOFError, BrokenPipeError):
                os._exit(0)  # the controller is gone

    def serve(self) -> None:
        """The main thread computes, reading its commands straight from the pipe (no hand-off: the
        permit latency is one pipe hop); a listener thread takes syncs from the second pipe."""
        from weave_rl.executor.local import messages as m

        try:
            for job in self.cfg.prebuild:  # imports and model skeletons: the cold start, not a warm switch
                self._workload(job)
        except Exception:  # noqa: BLE001  e.g. a bad workload option: the controller reports it
            self.send(m.Failed(-1, 0, self.cfg.wid, traceback.format_exc(limit=4)))
            os._exit(1)
        threading.Thread(target=self._sync_listener, name="sync-listener", daemon=True).start()
        self.send(m.Ready(self.cfg.wid, self.cfg.incarnation, os.getpid(), self.cfg.device))
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the controller died: so do we (its --resume starts fresh workers)
            if isinstance(msg, m.Stop):
                os._exit(0)
            self._compute(msg)

    def _sync_listener(self) -> None:
        while True:
            try:
                msg = self.sync_conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            threading.Thread(target=self._sync, args=(msg,), name=f"sync-{msg.sid}", daemon=True).start()

    def _compute(self, msg) -> None:
        from weave_rl.executor.local import messages as m

        try:
            if isinstance(msg, m.Warm):
                self._warm(msg)
            elif isinstance(msg, m.Permit):
                self._permit(msg)
            elif isinstance(msg, m.Unwarm):
                self._unwarm(msg.rid)
        except Exception:  # noqa: BLE001  reported to the controller, which decides
            rid = getattr(msg, "rid", -1)
            self._forget(getattr(msg, "job", None))
            self.send(m.Failed(rid, getattr(msg, "attempt", 0), self.cfg.wid, traceback.format_exc(limit=8)))

    # ----- state --------------------------------------------------------------------------------
    def _workload(self, job: str):
        from weave_rl.executor.workload import build_workload

        with self.build_lock:
            wl = self.workloads.get(job)
            if wl is None:
                block, seed = self.cfg.jobs[job]
                wl = self.workloads[job] = build_workload(job, block, default_seed=seed)
            return wl

    def _forget(self, job: str | None) -> None:
        """After a failed phase the job's state here is suspect: drop it (restored on next use)."""
        if job is None:
            return
        with self.locks[job]:
            if self.resident is not None and self.resident[0] == job:
                self.resident = None
            self.workloads.pop(job, None)
            for role in ("rollout", "train"):
                self.host.pop((job, role), None)
                self.version.pop((job, role), None)
            self.ledger.pop(job, None)

    def _ensure(self, job: str, role: str, version: int) -> None:
        """The host copy of (job, role) at ``version`` (train: exactly; rollout: at least)."""
        import torch

        wl = self._workload(job)
        key = (job, role)
        if role == "train":
            if self.version.get(key) == version and key in self.host:
                return
            if version < 0:
                self.host[key] = wl.initial_state("train")
                self.ledger[job] = []
            else:
                ck = torch.load(checkpoint_path(self.root, job, "train", version), weights_only=True)
                self.host[key] = ck["state"]
                self.ledger[job] = list(ck["ledger"])
            self.version[key] = version
            return
        if key not in self.host:
            self.host[key] = wl.initial_state("rollout")
            self.version.setdefault(key, -1)
        if self.version[key] < version:
            weights = torch.load(checkpoint_path(self.root, job, "policy", version), weights_only=True)
            wl.load_policy_weights(weights)
            self.version[key] = version

    def _offload(self) -> None:
        if self.resident is None:
            return
        job, role, _ = self.resident
        with self.locks[job]:
            self.host[(job, role)] = self.workloads[job].to_host(role)
        self.resident = None

    def _load(self, job: str, role: str, rid: int, version: int) -> None:
        self._offload()
        with self.locks[job]:
            self._ensure(job, role, version)
            self._workload(job).to_device(role, self.host[(job, role)], self.device)
        self.resident = (job, role, rid)

    # ----- commands -----------------------------------------------------------------------------
    def _warm(self, msg) -> None:
        t0 = time.monotonic()
        self._load(msg.job, msg.role, msg.rid, msg.version)
        self.warmed[msg.rid] = (msg.attempt, time.monotonic() - t0)

    def _unwarm(self, rid: int) -> None:
        self.warmed.pop(rid, None)
        if self.resident is not None and self.resident[2] == rid:
            self._offload()

    def _permit(self, msg) -> None:
        from weave_rl.executor.local import messages as m
        from weave_rl.executor.local.comm import make_all_reduce
        from weave_rl.executor.local.samples import load_samples, merge, save_atomic, save_samples, shard_path, split
        from weave_rl.executor.workload import RolloutCancelled

        attempt, switch = self.warmed.pop(msg.rid, (msg.attempt, 0.0))
        if self.resident is None or self.resident[2] != msg.rid or attempt != msg.attempt:
            t0 = time.monotonic()
            self._load(msg.job, msg.role, msg.rid, msg.version)
            switch = time.monotonic() - t0
        job, wl = msg.job, self._workload(msg.job)
        info: dict[str, Any] = {}
        with self.locks[job]:
            if msg.role == "rollout" and self.version.get((job, "rollout"), -1) < msg.version:
                t0 = time.monotonic()
                self._ensure(job, "rollout", msg.version)  # weights of a sync this worker missed
                switch += time.monotonic() - t0
            fns = wl.phases()
            if msg.role == "rollout":
                start = time.monotonic()
                if msg.task and self.cancel.value == msg.task:  # taken back before it started
                    self.send(m.Cancelled(msg.rid, msg.attempt, self.cfg.wid, msg.task, start, start))
                    return
                if msg.task:
                    wl._cancel_check = lambda: self.cancel.value == msg.task
                try:
                    samples = fns["reward"](fns["rollout"](msg.iteration, msg.shard, msg.shards))
                except RolloutCancelled:
                    self.send(m.Cancelled(msg.rid, msg.attempt, self.cfg.wid, msg.task, start, time.monotonic()))
                    return
                finally:
                    wl._cancel_check = None
                if msg.task and self.cancel.value == msg.task:  # taken back as it ended: dropped too
                    self.send(m.Cancelled(msg.rid, msg.attempt, self.cfg.wid, msg.task, start, time.monotonic()))
                    return
                end = time.monotonic()
                path = shard_path(self.root, job, msg.iteration, msg.shard)
                save_samples(samples, path)
                info = {"tokens": int(samples.tokens), "count": int(samples.count), "ids": list(samples.ids),
                        "stats": dict(samples.stats), "path": str(path)}
            else:
                start = time.monotonic()  # the phase starts with reading its inputs (the data plane)
                batch = merge([load_samples(p) for p in msg.inputs])
                mine = split(batch, msg.group.rank, msg.group.size) if msg.group else batch
                if msg.group is not None and msg.group.size > 1:
                    pg = self.groups.get(msg.group, nccl=self.device.type == "cuda")
                    reduce = make_all_reduce(pg, msg.group.size)
                else:
                    reduce = make_all_reduce(None, 1)
                out = fns["train"](msg.iteration, mine, reduce)
                end = time.monotonic()
                weights = wl.policy_weights()
                self.latest[job] = (msg.iteration, weights)
                ledger = self.ledger.setdefault(job, []) + list(batch.ids)
                self.ledger[job] = ledger
                info = {"metrics": {k: float(v) for k, v in (out or {}).items()} if isinstance(out, dict)
                        else ({"loss": float(out)} if out is not None else {}),
                        "count": int(mine.count), "batch": int(batch.count), "ledger": len(ledger),
                        "ledger_unique": len(set(ledger)), "stats": dict(batch.stats)}
            offload = 0.0
            if msg.task:  # a prompt group: the state stays for the next one (Unwarm offloads it)
                self.warmed[msg.rid] = (msg.attempt, 0.0)
            else:
                t0 = time.monotonic()
                self.host[(job, msg.role)] = wl.to_host(msg.role)
                self.resident = None
                offload = time.monotonic() - t0
                switch += offload
            if msg.role == "train":
                self.version[(job, "train")] = msg.iteration
                if msg.save:
                    root = self.root
                    save_atomic({"state": self.host[(job, "train")], "ledger": self.ledger[job],
                                 "iteration": msg.iteration}, checkpoint_path(root, job, "train", msg.iteration))
                    save_atomic(weights, checkpoint_path(root, job, "policy", msg.iteration))
                    for kind in ("train", "policy"):
                        old = checkpoint_path(root, job, kind, msg.iteration - KEEP_CHECKPOINTS)
                        old.unlink(missing_ok=True)
        info["permit_latency_s"] = max(0.0, start - msg.sent) if msg.sent else None
        # The device stays this phase's after its work ends: writing samples, copying the weights for
        # the sync, checkpointing (the offload is in switch_s). A refit counts it as phase time.
        info["after_s"] = max(0.0, time.monotonic() - end - offload)
        self.send(m.Done(msg.rid, msg.attempt, self.cfg.wid, start, end, switch, info, task=msg.task))

    def _sync(self, msg) -> None:
        import torch

        from weave_rl.executor.local import messages as m
        from weave_rl.executor.local.comm import broadcast_weights

        torch.set_num_threads(self.cfg.threads)
        try:
            start = time.monotonic()
            weights = None
            if msg.group.rank == 0:
                k, weights = self.latest.get(msg.job, (None, None))
                if k != msg.iteration:  # a fresh trainer after a crash: the checkpoint has them
                    weights = torch.load(checkpoint_path(self.root, msg.job, "policy", msg.iteration),
                                         weights_only=True)
            nbytes = 0
            if msg.group.size > 1:
                pg = self.groups.get(msg.group)
                weights, nbytes = broadcast_weights(pg, weights)
            if msg.load:
                with self.locks[msg.job]:
                    self._workload(msg.job).load_policy_weights(weights)
                    self.version[(msg.job, "rollout")] = msg.iteration
            self.send(m.SyncDone(msg.sid, msg.attempt, self.cfg.wid, start, time.monotonic(), nbytes))
        except Exception:  # noqa: BLE001
            self.send(m.Failed(msg.sid, msg.attempt, self.cfg.wid, traceback.format_exc(limit=8), sync=True))
