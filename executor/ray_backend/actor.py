"""``RayWorker``: one logical GPU as a Ray actor, running the local backend's worker logic.

The actor wraps ``weave_rl.executor.local.worker.Worker`` (the phase shim: warm-load from host memory, run
rollout + reward or train, offload, checkpoint; weight syncs into the host cache) and replaces its
pipes with actor methods whose return values are the messages the local worker would have sent:

- ``command(seq, msg)`` (``Warm``, ``Permit``, ``Unwarm``) in the ``compute`` concurrency group, run
  one at a time in the controller's order (``seq``; Ray does not promise the order of a threaded
  actor's calls), like the local worker's main thread;
- ``sync(msg)`` in the ``sync`` group, concurrently with compute, like the local sync listener;
- ``cancel(task)`` in the same group: the prompt group an elastic rollout takes back (the local
  worker's shared cancel cell);
- ``watch()`` blocks for the actor's life: its result fails when the actor dies, the Ray counterpart
  of a process sentinel (an idle actor's death is noticed too).

Thread setup (core pinning, torch threads) is per OS thread, so it is applied in every thread that
computes. ``root_token`` checks that the run folder (rollout shards, checkpoints) is the same folder
on this actor's node.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path

import ray

from weave_rl.executor.local import messages as m
from weave_rl.executor.local.worker import Worker, WorkerConfig

PROBE = ".ray-probe"


class _ActorWorker(Worker):
    """The local worker with its replies collected per calling thread instead of piped."""

    def __init__(self, cfg: WorkerConfig):
        super().__init__(cfg, None, None)
        self._out = threading.local()

    def send(self, msg) -> None:
        box = getattr(self._out, "box", None)
        if box is not None:
            box.append(msg)

    def collect(self, fn, *args) -> list:
        self._out.box = []
        try:
            fn(*args)
            return self._out.box
        finally:
            self._out.box = None


@ray.remote(concurrency_groups={"compute": 8, "sync": 8, "watch": 1})
class RayWorker:
    def __init__(self, cfg: WorkerConfig, root_token: str | None = None):
        self.cfg = cfg
        self.error: str | None = None
        self.turn = threading.Condition()
        self.next_seq = 0
        self.local = threading.local()
        self.stopped = threading.Event()
        self.worker: _ActorWorker | None = None
        sys.setswitchinterval(0.0005)  # a sync thread must not hold the GIL for 5 ms while a permit waits
        try:
            if root_token is not None:
                probe = Path(cfg.root) / PROBE
                seen = probe.read_text().strip() if probe.exists() else None
                if seen != root_token:
                    raise RuntimeError(f"the run folder {cfg.root} is not the driver's on node "
                                       f"{ray.util.get_node_ip_address()}: the ray backend needs --out on a "
                                       "filesystem every node mounts (rollout shards and checkpoints live there)")
            self._thread_setup()
            self.worker = _ActorWorker(cfg)
            for job in cfg.prebuild:  # imports and model skeletons: the cold start, not a warm switch
                self.worker._workload(job)
        except Exception:  # noqa: BLE001  reported by ready()
            self.error = traceback.format_exc(limit=4)

    def _thread_setup(self) -> None:
        """Core pinning and torch threads of the calling OS thread (once per thread)."""
        if getattr(self.local, "done", False):
            return
        import torch

        torch.set_num_threads(self.cfg.threads)
        kind, _, index = self.cfg.device.partition(":")
        if kind == "cpu" and self.cfg.pin_core and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            if cores:
                os.sched_setaffinity(0, {cores[int(index or 0) % len(cores)]})
        if kind == "cuda":
            torch.cuda.set_device(int(index or 0))
        self.local.done = True

    def ready(self) -> list:
        if self.error is not None:
            return [m.Failed(-1, 0, self.cfg.wid, self.error)]
        return [m.Ready(self.cfg.wid, self.cfg.incarnation, os.getpid(), self.cfg.device)]

    def describe(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "actor_id": ctx.get_actor_id(), "monotonic": time.monotonic(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def clock(self) -> float:
        return time.monotonic()

    @ray.method(concurrency_group="compute")
    def command(self, seq: int, msg) -> list:
        with self.turn:
            self.turn.wait_for(lambda: self.next_seq == seq)
        try:
            if self.worker is None:
                return [m.Failed(getattr(msg, "rid", -1), getattr(msg, "attempt", 0), self.cfg.wid,
                                 self.error or "worker not started")]
            self._thread_setup()
            return self.worker.collect(self.worker._compute, msg)
        finally:
            with self.turn:
                self.next_seq += 1
                self.turn.notify_all()

    @ray.method(concurrency_group="sync")
    def sync(self, msg) -> list:
        if self.worker is None:
            return [m.Failed(msg.sid, msg.attempt, self.cfg.wid, self.error or "worker not started", sync=True)]
        self._thread_setup()
        return self.worker.collect(self.worker._sync, msg)

    @ray.method(concurrency_group="sync")
    def cancel(self, task: int) -> list:
        """Take back the prompt group ``task`` (runs beside the computing thread, which checks it)."""
        if self.worker is not None:
            self.worker.cancel.value = task
        return []

    @ray.method(concurrency_group="watch")
    def watch(self) -> list:
        self.stopped.wait()
        return []
