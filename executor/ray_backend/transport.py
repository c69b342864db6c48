"""``RayTransport``: the worker backend's workers as Ray actors (DESIGN 5), one per logical GPU.

What ``WorkerBackend`` asks of a transport (``weave_rl.executor.local.transport.Transport``), over
``RayWorker`` actors:

- ``start``: one placement group per topology node (``cluster``), devices assigned per Ray node,
  one actor per logical GPU in its node's bundle, then every actor's ``Ready``;
- ``send``: ``Warm``/``Permit``/``Unwarm`` become ``command`` calls (numbered per actor, so the
  actor runs them in order), ``Sync`` a ``sync`` call; each call's result is the list of replies;
  ``cancel`` a ``cancel`` call;
- ``receive``: ``ray.wait`` on every outstanding call and every actor's ``watch`` call; a call that
  fails with ``RayActorError`` means the actor died (``ray.kill``, the process killed, its node
  lost): it is killed for good and reported ``Lost``; the backend's restart comes back to ``spawn``,
  which starts a new incarnation in the same bundle (same node, same device);
- heartbeat: a ``clock`` ping to every ready actor at least once a second; an actor whose ping stays
  unanswered for the timeout (a stopped or wedged process, which Ray still counts alive) is
  ``Hung``, killed, and ``Lost`` the same way;
- clocks: every time an actor reports is its node's ``time.monotonic()``; an actor on the driver's
  node shares the driver's clock, one on another node gets an offset measured when it starts (the
  smallest-round-trip ping), applied to permit times going out and start/end times coming back;
- a GPU only a later plan uses gets a one-bundle placement group (on its topology node's Ray node
  when that has one) and the least-used device there.

Data plane: unchanged from worker processes (rollout shards and checkpoints in the run folder, which
must be shared by every node); weights and gradients over torch.distributed gloo between actors
(``weave_rl.executor.local.comm``), rendezvous on a FileStore in the run folder (no listener).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from weave_rl.executor.local import messages as m
from weave_rl.executor.local.transport import (MALLOC_ENV, ConfigFn, Event, Hung, Lost, Reply, WorkerError,
                                               WorkerHandle, install_worker)
from weave_rl.executor.local.worker import WorkerConfig
from weave_rl.executor.ray_backend.actor import PROBE, RayWorker
from weave_rl.executor.ray_backend.cluster import NodePlacement, assign_devices, bundle_for
from weave_rl.topology.topology import node_of


@dataclass
class ActorWorker(WorkerHandle):
    """One incarnation of a logical GPU's actor."""

    actor: Any = None
    node: str = ""  # topology node
    bundle: int = 0
    offset: float = 0.0  # actor monotonic - driver monotonic
    seq: int = 0  # next command's number (the actor runs them in this order)
    watch: Any = None  # the call that fails when the actor dies
    ray_node: str = ""
    ip: str = ""
    actor_id: str = ""


class RayTransport:
    name = "ray"

    def __init__(self, root: Path, forced: dict[str, str] | None = None):
        self.root = Path(root)
        self.forced = dict(forced or {})  # GPU -> device given on the command line
        self.workers: list[ActorWorker] = []
        self.placements: dict[str, NodePlacement] = {}
        self.pending: dict[object, tuple[int, int]] = {}  # outstanding call -> (wid, incarnation)
        self.order: dict[object, int] = {}  # outstanding call -> when it was made (replies in call order)
        self._calls = 0
        self.driver_node = ""
        self.bind_host = "127.0.0.1"
        self.token = secrets.token_hex(8)
        self.bundles: dict[str, tuple[object, int, str]] = {}  # GPU -> (placement group, bundle, Ray node)
        self.node_res: dict[str, dict] = {}
        self.has_gpus = False
        self.started = False
        self.start_timeout_s = 180.0
        self.late_pgs: list[object] = []
        self.pings: dict[int, tuple[object, float, int]] = {}  # wid -> (clock call, sent, incarnation)

    def worker_root(self, root: Path) -> Path:
        return root.resolve()  # an actor's working directory is not the driver's

    # ----- lifecycle ----------------------------------------------------------------------------
    def start(self, gpus: Mapping[str, str], config: ConfigFn, timeout_s: float) -> list[WorkerHandle]:
        self.start_timeout_s = timeout_s
        self.driver_node = ray.get_runtime_context().get_node_id()
        resources = ray.cluster_resources()
        has_gpus = self.has_gpus = resources.get("GPU", 0) > 0
        nodes: dict[str, list[str]] = {}
        for g in sorted(gpus):
            nodes.setdefault(node_of(g), []).append(g)
        for node, node_gpus in sorted(nodes.items()):
            bundles = [bundle_for(has_gpus) for _ in node_gpus]
            pg = placement_group(bundles, strategy="STRICT_PACK", name=f"weave/{self.root.name}/{node}")
            self.placements[node] = NodePlacement(node, node_gpus, bundles, pg)
        deadline = time.monotonic() + timeout_s
        for p in self.placements.values():
            if not p.pg.wait(max(1.0, deadline - time.monotonic())):
                raise WorkerError(f"placement group of node {p.node} ({len(p.bundles)} bundles of {p.bundles[0]}, "
                                  f"STRICT_PACK) not placed within {timeout_s:.0f} s; the cluster has "
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
        devices = {g: self.forced.get(g, assigned[g]) for g in gpus}
        for p in self.placements.values():
            p.devices = {g: devices[g] for g in p.gpus}
        remote = any(p.ray_node != self.driver_node for p in self.placements.values())
        # The rendezvous is a FileStore in the run folder, which every node shares anyway (checked
        # by the probe below); gloo listens on loopback unless the actors span machines.
        self.bind_host = "" if remote else "127.0.0.1"
        (self.root / PROBE).write_text(self.token)
        for wid, gpu in enumerate(sorted(devices)):
            self.spawn(config(wid, gpu, devices[gpu]))
        # Ready (or the start failure) of every actor.
        calls = {w.actor.ready.remote(): w for w in self.workers}
        while calls:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"workers did not start within {timeout_s:.0f} s")
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
                    if isinstance(msg, m.Ready) and msg.incarnation == w.incarnation:
                        w.ready, w.pid = True, msg.pid
        self._measure_clocks()
        for w in self.workers:
            self._watch(w)
        self.started = True
        return list(self.workers)

    def _measure_clocks(self) -> None:
        infos = ray.get([w.actor.describe.remote() for w in self.workers])
        for w, info in zip(self.workers, infos):
            w.pid = info["pid"]
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

    def spawn(self, cfg: WorkerConfig) -> ActorWorker:
        gpu = cfg.gpu
        if gpu not in self.bundles:
            self._late_bundle(gpu)
        pg, index, ray_node = self.bundles[gpu]
        cfg = dataclasses.replace(cfg, bind_host=self.bind_host)
        env = {**MALLOC_ENV, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
               "OMP_NUM_THREADS": str(cfg.threads)}
        actor = RayWorker.options(
            name=None, max_restarts=0, num_cpus=1, num_gpus=0, runtime_env={"env_vars": env},
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
        ).remote(cfg, self.token)
        w = ActorWorker(cfg.wid, gpu, cfg.device, cfg.incarnation, actor=actor, node=node_of(gpu), bundle=index,
                        ray_node=ray_node, ip=self.node_res.get(ray_node, {}).get("ip", ""))
        if self.started:  # a restart, or a GPU only a later plan uses: its Ready comes through receive()
            if ray_node != self.driver_node:
                w.offset = next((o.offset for o in self.workers if o.ray_node == ray_node and o.offset), 0.0) \
                    or self._ping_offset(actor)
            self._track(actor.ready.remote(), w)
            self._watch(w)
        install_worker(self.workers, w)
        return w

    # ----- GPUs only a later plan uses (a replan) -------------------------------------------------
    def device_for(self, gpu: str, devices: Mapping[str, str]) -> str:
        self._late_bundle(gpu)
        device = self.forced.get(gpu) or self._late_device(gpu, devices)
        self.placements[node_of(gpu)].devices[gpu] = device
        return device

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

    def _late_device(self, gpu: str, devices: Mapping[str, str]) -> str:
        """The least-used device of ``gpu``'s Ray node (cuda:i, else cpu:i)."""
        ray_node = self.bundles[gpu][2]
        res = self.node_res.get(ray_node, {})
        n_gpu, n_cpu = int(res.get("GPU", 0)), max(1, int(res.get("CPU", 1)))
        pool = [f"cuda:{i}" for i in range(n_gpu)] if n_gpu else [f"cpu:{i}" for i in range(n_cpu)]
        load = {d: 0 for d in pool}
        for g, d in devices.items():
            if d in load and self.bundles.get(g, (None, None, None))[2] == ray_node:
                load[d] += 1
        return min(pool, key=lambda d: (load[d], pool.index(d)))

    def _ping_offset(self, actor) -> float:
        best = None
        for _ in range(5):
            t0 = time.monotonic()
            theirs = ray.get(actor.clock.remote(), timeout=self.start_timeout_s)
            t1 = time.monotonic()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, theirs - (t0 + t1) / 2)
        return best[1]

    def _watch(self, w: ActorWorker) -> None:
        w.watch = w.actor.watch.remote()
        self._track(w.watch, w)

    def _track(self, ref, w: ActorWorker) -> None:
        self.pending[ref] = (w.wid, w.incarnation)
        self._calls += 1
        self.order[ref] = self._calls

    # ----- descriptions -------------------------------------------------------------------------
    def worker_rows(self) -> list[dict]:
        return [{"gpu": w.gpu, "device": w.device, "pid": w.pid, "incarnation": w.incarnation, "node": w.node,
                 "bundle": w.bundle, "ray_node": w.ray_node, "ip": w.ip, "actor_id": _actor_id(w.actor)}
                for w in self.workers]

    def write_placement(self, root: Path) -> None:
        data = {"strategy": "STRICT_PACK", "driver_node": self.driver_node,
                "gloo_bind": self.bind_host or "default interface",
                "nodes": [{"node": p.node, "placement_group": p.pg.id.hex(), "ray_node": p.ray_node, "ip": p.ip,
                           "bundles": [{"gpu": g, "placement_group": self.bundles[g][0].id.hex(),
                                        "index": self.bundles[g][1], "resources": p.bundles[i],
                                        "device": p.devices.get(g, "")} for i, g in enumerate(p.gpus)]}
                          for p in self.placements.values()]}
        (root / "ray_placement.json").write_text(json.dumps(data, indent=1))

    # ----- messages -----------------------------------------------------------------------------
    def send(self, wid: int, msg: Any, sync: bool = False) -> None:
        w = self.workers[wid]
        if isinstance(msg, m.Permit) and msg.sent:
            msg = dataclasses.replace(msg, sent=msg.sent + w.offset)  # the actor's clock
        if sync:
            ref = w.actor.sync.remote(msg)
        else:
            ref = w.actor.command.remote(w.seq, msg)
            w.seq += 1
        self._track(ref, w)

    def cancel(self, wid: int, task: int) -> None:
        w = self.workers[wid]
        self._track(w.actor.cancel.remote(task), w)

    def receive(self, timeout: float) -> Iterator[Event]:
        refs = list(self.pending)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in sorted(ready, key=lambda r: self.order.get(r, 0)):
            wid, incarnation = self.pending.pop(ref, (None, None))
            self.order.pop(ref, None)
            if wid is None:
                continue  # dropped with its actor
            w = self.workers[wid]
            try:
                msgs = ray.get(ref)
            except RayActorError as exc:
                if incarnation == w.incarnation:
                    yield self._lost(w, exc)
                continue
            if incarnation != w.incarnation:
                continue  # an answer from a dead incarnation's last moments: its re-run replaces it
            for msg in msgs:
                yield Reply(wid, incarnation, self._to_driver_clock(w, msg))

    def check_heartbeats(self, timeout_s: float) -> Iterator[Event]:
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
                elif now - sent > timeout_s:
                    del self.pings[wid]
                    yield Hung(wid, inc, now - sent)
                    yield self._lost(w, TimeoutError(f"no heartbeat for {now - sent:.1f} s"))
        for w in self.workers:
            if w.ready and w.wid not in self.pings:
                self.pings[w.wid] = (w.actor.clock.remote(), now, w.incarnation)

    def _to_driver_clock(self, w: ActorWorker, msg):
        if w.offset and isinstance(msg, (m.Done, m.SyncDone)):
            return dataclasses.replace(msg, start=msg.start - w.offset, end=msg.end - w.offset)
        return msg

    def _lost(self, w: ActorWorker, exc: Exception) -> Lost:
        """The actor is gone (or unreachable: then it is killed for good); its calls are dropped."""
        try:
            ray.kill(w.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass
        for ref, (wid, inc) in list(self.pending.items()):
            if wid == w.wid and inc == w.incarnation:
                self.pending.pop(ref, None)
                self.order.pop(ref, None)
        return Lost(w.wid, w.incarnation, _first(exc))


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
