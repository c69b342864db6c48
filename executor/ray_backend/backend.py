"""``RayBackend``: the Backend protocol over Ray actors (DESIGN 5), one actor per logical GPU.

It is the local backend with another transport: it subclasses ``LocalBackend`` and keeps all its
bookkeeping (phase and sync executions, attempts, results, measured times, job rows, permit
latency) and its fault handling (``_died``: restart, re-run a rollout shard alone, a train gang or a
weight sync on all members, no sample lost or trained twice), and replaces what touches processes
and pipes:

- ``start``: one placement group per topology node (``cluster``), devices assigned per Ray node,
  one ``RayWorker`` actor per logical GPU in its node's bundle, then every actor's ``Ready``;
- ``_send``: ``Warm``/``Permit``/``Unwarm`` become ``command`` calls (numbered per actor, so the
  actor runs them in order), ``Sync`` a ``sync`` call; each call's result is the list of replies;
- ``step``: ``ray.wait`` on every outstanding call and every actor's ``watch`` call, with a timeout
  that respects ``call_at`` timers; a call that fails with ``RayActorError`` means the actor died
  (``ray.kill``, the process killed, its node lost): it is killed for good and handed to
  ``LocalBackend._died``, which starts a new incarnation in the same bundle (same node, same device);
- heartbeat: a ``clock`` ping to every actor at least once a second; an actor whose ping stays
  unanswered for ``heartbeat_timeout_s`` (a stopped or wedged process, which Ray still counts alive)
  is killed and restarted the same way (event ``worker_hung``);
- clocks: every time an actor reports is its node's ``time.monotonic()``; an actor on the driver's
  node shares the driver's clock, one on another node gets an offset measured at start (the
  smallest-round-trip ping), applied to permit times going out and start/end times coming back.

Data plane: unchanged from the local backend (rollout shards and checkpoints in the run folder, which
must be shared by every node); weights and gradients over torch.distributed gloo between actors
(``weave_rl.executor.local.comm``), rendezvous on a FileStore in the run folder (no listener).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from weave_rl.executor.local import messages as m
from weave_rl.executor.local.backend import MALLOC_ENV, LocalBackend, WorkerError, drop_rendezvous, make_rendezvous
from weave_rl.executor.local.worker import WorkerConfig
from weave_rl.executor.ray_backend.actor import PROBE, RayWorker
from weave_rl.executor.ray_backend.cluster import NodePlacement, assign_devices, bundle_for
from weave_rl.topology.topology import node_of


class _NoProc:
    """What ``LocalBackend`` reads of a worker's process (pid, exit code, join): an actor has no handle."""

    def __init__(self) -> None:
        self.exitcode: str | None = None
        self.pid: int | None = None

    def join(self, timeout: float | None = None) -> None:
        return None


class _NoPipe:
    def close(self) -> None:
        return None


@dataclass
class _ActorRef:
    """One incarnation of a logical GPU's actor (duck-types ``LocalBackend``'s ``_Worker``)."""

    wid: int
    gpu: str
    device: str
    actor: object
    incarnation: int = 0
    ready: bool = False
    restarts: int = 0
    late: bool = False  # spawned during the run (a GPU only a later plan uses)
    node: str = ""  # topology node
    bundle: int = 0
    pid: int | None = None
    offset: float = 0.0  # actor monotonic - driver monotonic
    seq: int = 0
    watch: object = None
    ray_node: str = ""
    ip: str = ""
    actor_id: str = ""
    proc: _NoProc = field(default_factory=_NoProc)
    conn: _NoPipe = field(default_factory=_NoPipe)
    sync_conn: _NoPipe = field(default_factory=_NoPipe)


class RayBackend(LocalBackend):
    name = "ray"  # metrics.json's backend

    def __init__(self, topology, jobs, gpus: Sequence[str], root: Path, *, devices: dict[str, str] | None = None,
                 **kwargs):
        super().__init__(topology, jobs, {g: (devices or {}).get(g, "") for g in gpus}, root, **kwargs)
        self.forced = dict(devices or {})
        self.placements: dict[str, NodePlacement] = {}
        self.pending: dict[object, tuple[int, int]] = {}  # outstanding call -> (wid, incarnation)
        self.order: dict[object, int] = {}
        self.driver_node = ""
        self.bind_host = "127.0.0.1"
        self.token = secrets.token_hex(8)
        self.bundles: dict[str, tuple[object, int, str]] = {}  # GPU -> (placement group, bundle, Ray node)
        self.node_res: dict[str, dict] = {}
        self.has_gpus = False
        self.started = False
        self.late_pgs: list[object] = []
        self.pings: dict[int, tuple[object, float, int]] = {}  # wid -> (clock call, sent, incarnation)

    # ----- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self.driver_node = ray.get_runtime_context().get_node_id()
        resources = ray.cluster_resources()
        has_gpus = self.has_gpus = resources.get("GPU", 0) > 0
        nodes: dict[str, list[str]] = {}
        for g in sorted(self.devices):
            nodes.setdefault(node_of(g), []).append(g)
        for node, gpus in sorted(nodes.items()):
            bundles = [bundle_for(has_gpus) for _ in gpus]
            pg = placement_group(bundles, strategy="STRICT_PACK", name=f"weave/{self.root.name}/{node}")
            self.placements[node] = NodePlacement(node, gpus, bundles, pg)
        deadline = time.monotonic() + self.start_timeout_s
        for p in self.placements.values():
            if not p.pg.wait(max(1.0, deadline - time.monotonic())):
                raise WorkerError(f"placement group of node {p.node} ({len(p.bundles)} bundles of {p.bundles[0]}, "
                                  f"STRICT_PACK) not placed within {self.start_timeout_s:.0f} s; the cluster has "
                                  f"{ {k: v for k, v in resources.items() if k in ('CPU', 'GPU')} }")
        node_res = self.node_res = {n["NodeID"]: {**n.get("Resources", {}), "ip": n.get("NodeManagerAddress", "")}
                                    for n in ray.nodes() if n.get("Alive")}
        for p in self.placements.values():
            entry = ray.util.placement_group_table(p.pg)
            p.ray_node = entry["bundles_to_node_id"][0]
            p.ip = node_res.get(p.ray_node, {}).get("ip", "")
            for i, g in enumerate(p.gpus):
                self.bundles[g] = (p.pg, i, p.ray_node)
        assigned = assign_devices(list(self.placements.values()), node_res)
        for g in self.devices:
            self.devices[g] = self.forced.get(g, assigned[g])
        for p in self.placements.values():
            p.devices = {g: self.devices[g] for g in p.gpus}
        remote = any(p.ray_node != self.driver_node for p in self.placements.values())
        # The rendezvous is a FileStore in the run folder, which every node shares anyway (checked
        # by the probe below); gloo listens on loopback unless the actors span machines.
        self.bind_host = "" if remote else "127.0.0.1"
        self.rendezvous = make_rendezvous(self.root.resolve())
        (self.root / PROBE).write_text(self.token)
        for wid, gpu in enumerate(sorted(self.devices)):
            self.wid_of[gpu] = wid
            self.workers.append(self._spawn(wid, gpu, self.devices[gpu], 0))
        # Ready (or the start failure) of every actor.
        calls = {w.actor.ready.remote(): w for w in self.workers}
        while calls:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"workers did not start within {self.start_timeout_s:.0f} s")
            done, _ = ray.wait(list(calls), num_returns=1, timeout=left)
            for ref in done:
                w = calls.pop(ref)
                try:
                    msgs = ray.get(ref)
                except RayActorError as exc:
                    raise WorkerError(f"worker for {w.gpu} ({w.device}) died while starting: {_first(exc)}") from None
                for msg in msgs:
                    if isinstance(msg, m.Failed):
                        raise WorkerError(f"worker for {w.gpu} ({w.device}) could not start:\n{msg.error.strip()}")
                    self._handle(msg)
        self._measure_clocks()
        for w in self.workers:
            self._watch(w)
        self.started = True
        self.t0 = time.monotonic() - self.clock_start
        self._write_workers()
        self._write_placement()

    def _measure_clocks(self) -> None:
        infos = ray.get([w.actor.describe.remote() for w in self.workers])
        for w, info in zip(self.workers, infos):
            w.pid = w.proc.pid = info["pid"]
            w.ray_node, w.ip, w.actor_id = info["node_id"], info["ip"], info["actor_id"]
            # One machine, one CLOCK_MONOTONIC; another node's is measured (smallest-round-trip ping).
            w.offset = 0.0 if info["node_id"] == self.driver_node else self._ping_offset(w.actor)

    def stop(self) -> None:
        for w in self.workers:
            try:
                ray.kill(w.actor, no_restart=True)
            except Exception:  # noqa: BLE001  already gone
                pass
        for pg in [p.pg for p in self.placements.values()] + self.late_pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass
        self.pending.clear()
        (self.root / PROBE).unlink(missing_ok=True)
        drop_rendezvous(self.rendezvous)

    def _spawn(self, wid: int, gpu: str, device: str, incarnation: int) -> _ActorRef:
        node = node_of(gpu)
        if gpu not in self.bundles:
            self._late_bundle(gpu)
        pg, index, ray_node = self.bundles[gpu]
        cfg = WorkerConfig(wid, incarnation, gpu, device, self.threads, self.rendezvous,
                           str(self.root.resolve()), self.blocks, self.pin_cores,
                           tuple(sorted(self.gpu_jobs.get(gpu, ()))), bind_host=self.bind_host)
        env = {**MALLOC_ENV, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
               "OMP_NUM_THREADS": str(self.threads)}
        actor = RayWorker.options(
            name=None, max_restarts=0, num_cpus=1, num_gpus=0, runtime_env={"env_vars": env},
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
        ).remote(cfg, self.token)
        w = _ActorRef(wid, gpu, device, actor, incarnation, node=node, bundle=index, ray_node=ray_node,
                      ip=self.node_res.get(ray_node, {}).get("ip", ""))
        if self.started:  # a restart, or a GPU only a later plan uses: its Ready comes through step()
            if ray_node != self.driver_node:
                w.offset = next((o.offset for o in self.workers if o.ray_node == ray_node and o.offset), 0.0) \
                    or self._ping_offset(actor)
            self._track(actor.ready.remote(), w)
            self._watch(w)
        return w

    # ----- GPUs only a later plan uses (a replan) -------------------------------------------------
    def _wid(self, gpu: str, job: str | None = None) -> int:
        if gpu not in self.wid_of:
            self._late_bundle(gpu)
            self.devices[gpu] = self.forced.get(gpu) or self._late_device(gpu)
            wid = super()._wid(gpu, job)
            self._write_placement()
            return wid
        return super()._wid(gpu, job)

    def _late_bundle(self, gpu: str) -> None:
        """A one-bundle placement group for ``gpu``: on the Ray node of its topology node when that
        has one already (the ``node:<ip>`` resource pins it), else wherever it fits."""
        if gpu in self.bundles:
            return
        node = node_of(gpu)
        bundle = dict(bundle_for(self.has_gpus))
        p = self.placements.get(node)
        if p is not None and p.ip:
            bundle[f"node:{p.ip}"] = 0.001
        pg = placement_group([bundle], strategy="STRICT_PACK", name=f"weave/{self.root.name}/{gpu}")
        if not pg.wait(self.start_timeout_s):
            raise WorkerError(f"no room for {gpu} ({bundle}) on the Ray cluster within {self.start_timeout_s:.0f} s")
        ray_node = ray.util.placement_group_table(pg)["bundles_to_node_id"][0]
        if p is None:
            p = self.placements[node] = NodePlacement(node, [], [], pg, ray_node,
                                                      self.node_res.get(ray_node, {}).get("ip", ""))
        p.gpus.append(gpu)
        p.bundles.append(bundle)
        self.late_pgs.append(pg)
        self.bundles[gpu] = (pg, 0, ray_node)

    def _late_device(self, gpu: str) -> str:
        """The least-used device of ``gpu``'s Ray node (cuda:i, else cpu:i)."""
        ray_node = self.bundles[gpu][2]
        res = self.node_res.get(ray_node, {})
        n_gpu, n_cpu = int(res.get("GPU", 0)), max(1, int(res.get("CPU", 1)))
        pool = [f"cuda:{i}" for i in range(n_gpu)] if n_gpu else [f"cpu:{i}" for i in range(n_cpu)]
        load = {d: 0 for d in pool}
        for g, d in self.devices.items():
            if d in load and self.bundles.get(g, (None, None, None))[2] == ray_node:
                load[d] += 1
        device = min(pool, key=lambda d: (load[d], pool.index(d)))
        self.placements[node_of(gpu)].devices[gpu] = device
        return device

    def _ping_offset(self, actor) -> float:
        best = None
        for _ in range(5):
            t0 = time.monotonic()
            theirs = ray.get(actor.clock.remote(), timeout=self.start_timeout_s)
            t1 = time.monotonic()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, theirs - (t0 + t1) / 2)
        return best[1]

    def _watch(self, w: _ActorRef) -> None:
        w.watch = w.actor.watch.remote()
        self._track(w.watch, w)

    def _track(self, ref, w: _ActorRef) -> None:
        self.pending[ref] = (w.wid, w.incarnation)
        self.order[ref] = next(self._ids)

    def _write_workers(self) -> None:
        data = [{"gpu": w.gpu, "device": w.device, "pid": w.pid, "incarnation": w.incarnation, "node": w.node,
                 "bundle": w.bundle, "ray_node": w.ray_node, "ip": w.ip,
                 "actor_id": _actor_id(w.actor)} for w in self.workers]
        tmp = self.root / ".workers.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.root / "workers.json")

    def _write_placement(self) -> None:
        data = {"strategy": "STRICT_PACK", "driver_node": self.driver_node, "gloo_bind": self.bind_host or "default interface",
                "nodes": [{"node": p.node, "placement_group": p.pg.id.hex(), "ray_node": p.ray_node, "ip": p.ip,
                           "bundles": [{"gpu": g, "placement_group": self.bundles[g][0].id.hex(),
                                        "index": self.bundles[g][1], "resources": p.bundles[i],
                                        "device": self.devices.get(g, "")} for i, g in enumerate(p.gpus)]}
                          for p in self.placements.values()]}
        (self.root / "ray_placement.json").write_text(json.dumps(data, indent=1))

    # ----- transport ----------------------------------------------------------------------------
    def _send(self, wid: int, msg, sync: bool = False) -> None:
        w = self.workers[wid]
        if isinstance(msg, m.Permit) and msg.sent:
            msg = dataclasses.replace(msg, sent=msg.sent + w.offset)  # the actor's clock
        if sync:
            ref = w.actor.sync.remote(msg)
        else:
            ref = w.actor.command.remote(w.seq, msg)
            w.seq += 1
        self._track(ref, w)

    def _cancel(self, wid: int, task: int) -> None:
        w = self.workers[wid]
        self._track(w.actor.cancel.remote(task), w)

    def _receive(self, timeout: float) -> None:
        refs = list(self.pending)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in sorted(ready, key=lambda r: self.order.get(r, 0)):
            wid, incarnation = self.pending.pop(ref, (None, None))
            self.order.pop(ref, None)
            if wid is None:
                continue
            w = self.workers[wid]
            try:
                msgs = ray.get(ref)
            except RayActorError as exc:
                if incarnation == w.incarnation:
                    self._lost(w, exc)
                continue
            if incarnation != w.incarnation:
                continue  # an answer from a dead incarnation's last moments: its re-run replaces it
            for msg in msgs:
                self._handle(self._to_driver_clock(w, msg))

    def _check_heartbeats(self) -> None:
        """Collect answered pings, declare an actor silent past the timeout hung, ping the others."""
        if not self.started:
            return
        now = time.monotonic()
        if self.pings:
            refs = [ref for ref, _, _ in self.pings.values()]
            answered, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done = set(answered)
            for wid, (ref, sent, inc) in list(self.pings.items()):
                if ref in done:
                    del self.pings[wid]
                    continue
                w = self.workers[wid]
                if inc != w.incarnation:
                    del self.pings[wid]
                elif now - sent > self.heartbeat_timeout_s:
                    del self.pings[wid]
                    self.events.append({"t": self.now(), "event": "worker_hung", "gpu": w.gpu, "pid": w.pid,
                                        "incarnation": w.incarnation, "silent_s": round(now - sent, 3)})
                    self._lost(w, TimeoutError(f"no heartbeat for {now - sent:.1f} s"))
        for w in self.workers:
            if w.ready and w.wid not in self.pings:
                self.pings[w.wid] = (w.actor.clock.remote(), now, w.incarnation)

    def _to_driver_clock(self, w: _ActorRef, msg):
        if w.offset and isinstance(msg, (m.Done, m.SyncDone)):
            return dataclasses.replace(msg, start=msg.start - w.offset, end=msg.end - w.offset)
        return msg

    def _handle(self, msg) -> None:
        if isinstance(msg, m.Ready):
            w = self.workers[msg.wid]
            if msg.incarnation == w.incarnation:
                w.pid = w.proc.pid = msg.pid
        elif isinstance(msg, m.Failed) and msg.rid == -1 and not msg.sync:  # a restarted actor's start
            raise WorkerError(f"worker for {self.workers[msg.wid].gpu} could not restart:\n{msg.error.strip()}")
        super()._handle(msg)

    def _lost(self, w: _ActorRef, exc: Exception) -> None:
        """The actor is gone (or unreachable: then it is killed for good): restart it as a dead local worker."""
        try:
            ray.kill(w.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass
        for ref, (wid, inc) in list(self.pending.items()):
            if wid == w.wid and inc == w.incarnation:
                self.pending.pop(ref, None)
                self.order.pop(ref, None)
        w.proc.exitcode = _first(exc)
        self._died(w)


def _first(exc: Exception) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return type(exc).__name__


def _actor_id(actor) -> str:
    try:
        return actor._actor_id.hex()
    except AttributeError:
        return ""
