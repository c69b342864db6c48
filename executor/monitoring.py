"""Prometheus metrics of a running executor, for any backend (issue 8, part 3).

Usage (``weave simulate --metrics-port`` and ``weave run --metrics-port`` do exactly this)::

    from weave_rl.executor.monitoring import start_metrics_server

    server = start_metrics_server(controller, port, addr="127.0.0.1")  # or a ControllerMonitor
    ...                    # drive the controller; GET http://127.0.0.1:{server.port}/metrics
    server.close()         # stops the HTTP thread and detaches the monitor's hooks

``start_metrics_server(target, port, addr="127.0.0.1") -> MetricsServer``: ``target`` is a
``Controller`` (a ``ControllerMonitor`` is attached to it) or an existing ``ControllerMonitor``;
``port`` 0 picks a free port (read it back from ``server.port``); ``addr`` defaults to loopback on
purpose (the metrics name jobs and nodes). The server runs in a daemon thread and serves only the
monitor's own ``CollectorRegistry``, never the process-global one, so several monitors (tests, a
trace and its baseline) can live in one process. Attach the monitor before the run starts so that it
sees every record (``simulate_plan(..., setup=...)``); attaching later replays the records so far.

The monitor is an observer: it hooks ``controller.on_phase`` / ``on_iteration`` / ``on_job_finished``
and reads ``controller.records`` and ``controller.events`` incrementally (cursors), so it needs no
change in any backend. Metric families (all prefixed ``weave_``):

- ``weave_phase_duration_seconds{job,phase}`` histogram: ``duration_s`` of every record (rollout,
  train, sync); its total count equals ``len(controller.records)``.
- ``weave_switch_seconds{job,phase,cluster}`` histogram: warm switches (``switch_s > 0``) before a phase.
- ``weave_sync_seconds{job}`` histogram: weight syncs (the sync records' ``duration_s``).
- ``weave_queue_depth{node}`` gauge: phase instances queued on the node's GPUs that have not started
  (one per job stream and phase at the head of the FIFO, plus restarted iterations waiting in front).
- ``weave_pool_idle_ratio{cluster}`` gauge: share of the held GPU-seconds of the cluster (pool) so far
  spent neither computing nor switching, counting finished phases; at the end of a run it equals
  ``metrics.json``'s ``clusters[c].bubble_share``.
- ``weave_pool_busy_gpu_seconds_total{cluster,role}`` counter: compute GPU-seconds by phase (role).
- ``weave_gpus_held{cluster}`` and ``weave_usd_per_hour`` gauges: what the controller holds now.
- ``weave_replans_total{reason}`` counter: plan changes installed (controller events ``switch`` and
  ``admit``), labelled by the reason's first word (``drift``, ``admit``, ``release``, ``re-optimize``,
  ``replan``) to keep the label set small.
- ``weave_worker_restarts_total{job}`` counter: iterations restarted after a fault.
- ``weave_worker_deaths_total{gpu}`` counter: worker processes (actors) of a real-worker backend that
  died and were restarted (``weave run --metrics-port``).
- ``weave_node_failures_total{node}`` counter and ``weave_iterations_total{job}`` counter.
- ``weave_sim_time_seconds`` gauge: the controller's clock (simulated or wall time of the backend).

Threads: records and events are read by slicing append-only lists, under a lock, from either the
controller's thread (hooks) or the scrape thread. The state gauges (queue depths, idle ratios, what
is held, the clock) are current at scrape time: every scrape refreshes them from the controller
first (``ControllerMonitor.scrape``), so a fast simulation's first scrape never shows zeros next to
hundreds of iterations. Their inputs are copied (``list(dict.items())`` holds the GIL throughout for
the controller's str/tuple keys) and a refresh that still meets a structure changing under it keeps
the previous values and is retried by the next scrape; the controller's thread also refreshes them
(at most every ``state_every_s`` wall seconds, and whenever a job finishes).

After the run: ``MetricsServer.linger(seconds)`` (``--metrics-linger S`` of ``weave simulate`` and
``weave run``, default ``DEFAULT_LINGER_S`` = 75 s, more than Prometheus' default 1-minute scrape
interval) keeps the endpoint up with the final values until one scrape has read them or the time is
over, whichever comes first; 0 closes it with the run.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import Metric

from weave_rl.executor.controller import Controller
from weave_rl.executor.outputs import held_stats
from weave_rl.topology.topology import node_of
from weave_rl.core.errors import InputError

PHASE_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 180, 300, 600, 1200, 3600, float("inf"))
SHORT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, float("inf"))
PLAN_EVENTS = ("switch", "admit")
DEFAULT_LINGER_S = 75.0  # > Prometheus' default scrape_interval (1 min): one scrape sees the final values
SCRAPE_GRACE_S = 0.5  # after the scrape that read the final values, before the server closes


def reason_kind(reason: str) -> str:
    """``"drift: A rollout at 1.50x ..."`` -> ``drift``; ``"admit J3"`` -> ``admit``."""
    head = reason.strip().split(":", 1)[0].split(" ", 1)[0]
    return head or "replan"


class _Poll:
    """A collector that yields nothing: it makes every scrape drain new records and events first."""

    def __init__(self, poll: Callable[[], None]):
        self._poll = poll

    def collect(self) -> Iterator[Metric]:
        self._poll()
        return iter(())


class ControllerMonitor:
    """Keeps Prometheus metrics of one controller in its own registry (see module doc)."""

    def __init__(self, controller: Controller, registry: CollectorRegistry | None = None, *,
                 state_every_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.controller = controller
        self.registry = registry if registry is not None else CollectorRegistry()
        self.state_every_s = state_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state_lock = threading.Lock()  # one state refresh at a time (controller thread vs scrape)
        self._records = 0  # cursors into controller.records / controller.events
        self._events = 0
        self._last_state = -float("inf")
        self._busy: dict[str, float] = {}  # cluster -> compute GPU-s of finished phases
        self._switch: dict[str, float] = {}
        self.registry.register(_Poll(self.scrape))  # first, so that a scrape sees fresh values
        r = self.registry
        self.phase_s = Histogram("weave_phase_duration_seconds", "Measured duration of a phase (record duration_s).",
                                 ["job", "phase"], buckets=PHASE_BUCKETS, registry=r)
        self.switch_s = Histogram("weave_switch_seconds", "Warm switch before a phase (switch_s > 0).",
                                  ["job", "phase", "cluster"], buckets=SHORT_BUCKETS, registry=r)
        self.sync_s = Histogram("weave_sync_seconds", "Weight sync duration.", ["job"], buckets=SHORT_BUCKETS,
                                registry=r)
        self.queue_depth = Gauge("weave_queue_depth", "Phase instances queued on the node's GPUs, not started.",
                                 ["node"], registry=r)
        self.idle_ratio = Gauge("weave_pool_idle_ratio", "Held GPU-seconds neither computing nor switching / held.",
                                ["cluster"], registry=r)
        self.busy = Counter("weave_pool_busy_gpu_seconds", "Compute GPU-seconds of finished phases.",
                            ["cluster", "role"], registry=r)
        self.gpus_held = Gauge("weave_gpus_held", "GPUs held now.", ["cluster"], registry=r)
        self.usd = Gauge("weave_usd_per_hour", "Price of the nodes held now ($/h).", registry=r)
        self.replans = Counter("weave_replans", "Plan changes installed, by the reason's first word.", ["reason"],
                               registry=r)
        self.restarts = Counter("weave_worker_restarts", "Iterations restarted after a fault.", ["job"], registry=r)
        self.failures = Counter("weave_node_failures", "Nodes that went down.", ["node"], registry=r)
        self.iterations = Counter("weave_iterations", "Completed iterations (sync done).", ["job"], registry=r)
        self.worker_deaths = Counter("weave_worker_deaths", "Worker processes (or actors) that died and were "
                                     "restarted by a real-worker backend.", ["gpu"], registry=r)
        self.scrapes = 0  # scrapes served (each refreshes the gauges first)
        self.last_scrape_began = -math.inf  # time.monotonic() when the last scrape began reading
        self._worker_events: list[dict] | None = None  # a real backend's event list (follow_worker_events)
        self._worker_seen = 0
        self.clock_s = Gauge("weave_sim_time_seconds", "The controller's clock.", registry=r)
        self._hooks = [(controller.on_phase, self._on_phase), (controller.on_iteration, self._on_iteration),
                       (controller.on_job_finished, self._on_finished)]
        for hooks, fn in self._hooks:
            hooks.append(fn)
        self.poll()
        self.refresh_state()

    # ----- hooks (controller thread) -------------------------------------------------------------
    def _on_phase(self, _row: dict) -> None:
        self.poll()
        if self._clock() - self._last_state >= self.state_every_s:
            self.refresh_state()

    def _on_iteration(self, job: str, _k: int, _t: float) -> None:
        self.iterations.labels(job).inc()

    def _on_finished(self, _job: str, _t: float) -> None:
        self.poll()
        self.refresh_state()

    def close(self) -> None:
        """Detach from the controller (the registry keeps its last values)."""
        for hooks, fn in self._hooks:
            if fn in hooks:
                hooks.remove(fn)

    def follow_worker_events(self, events: list[dict]) -> None:
        """Also count the worker deaths in a real backend's event list (``LocalBackend.events``): the
        local and Ray backends restart a dead worker themselves, below the controller."""
        with self._lock:
            self._worker_events, self._worker_seen = events, 0

    def scrape(self) -> None:
        """What each scrape does before the registry is read: new records and events, then the state
        gauges (see module doc on threads)."""
        self.last_scrape_began = time.monotonic()
        self.poll()
        try:
            self.refresh_state()
        except (RuntimeError, KeyError, IndexError, ValueError):  # a structure changed under the copy
            pass  # the previous values stay; the next scrape (or the controller's own refresh) retries
        self.scrapes += 1

    # ----- incremental reads ----------------------------------------------------------------------
    def poll(self) -> None:
        """Account for records and events appended since the last call (any thread)."""
        with self._lock:
            c = self.controller
            rows = c.records[self._records:]
            events = c.events[self._events:]
            self._records += len(rows)
            self._events += len(events)
            for row in rows:
                self._record(row)
            if self._worker_events is not None:
                fresh = self._worker_events[self._worker_seen:]
                self._worker_seen += len(fresh)
                for e in fresh:
                    if e.get("event") == "worker_died":
                        self.worker_deaths.labels(str(e.get("gpu", ""))).inc()
            for e in events:
                kind = e.get("event")
                if kind in PLAN_EVENTS:
                    self.replans.labels(reason_kind(str(e.get("reason", "replan")))).inc()
                elif kind == "restart":
                    self.restarts.labels(e["job"]).inc()
                elif kind == "node_down":
                    self.failures.labels(e["node"]).inc()

    def _record(self, row: dict) -> None:
        job, phase = row["job"], row["phase"]
        self.phase_s.labels(job, phase).observe(row["duration_s"])
        if phase == "sync":
            self.sync_s.labels(job).observe(row["duration_s"])
            return
        cluster = str(row.get("cluster", ""))
        if row.get("switch_s", 0.0) > 0:
            self.switch_s.labels(job, phase, cluster).observe(row["switch_s"])
        busy = float(row.get("busy_gpu_s", 0.0))
        self._busy[cluster] = self._busy.get(cluster, 0.0) + busy
        self._switch[cluster] = self._switch.get(cluster, 0.0) + float(row.get("switch_gpu_s", 0.0))
        self.busy.labels(cluster, phase).inc(busy)

    # ----- state gauges (controller thread, and each scrape) ----------------------------------------
    def refresh_state(self) -> None:
        """Queue depths, idle ratios and what is held, read from the controller now."""
        with self._state_lock:
            self._refresh_state()

    def _refresh_state(self) -> None:
        self._last_state = self._clock()
        c = self.controller
        now = c.now
        depths = queue_depths(c)
        held = held_stats(c, now)["held_gpu_s"]
        self.clock_s.set(now)
        for node, depth in depths.items():
            self.queue_depth.labels(node).set(depth)
        with self._lock:
            for cluster, gpu_s in held.items():
                if gpu_s > 0:
                    used = self._busy.get(cluster, 0.0) + self._switch.get(cluster, 0.0)
                    self.idle_ratio.labels(cluster).set(max(0.0, 1.0 - used / gpu_s))
        if c.held_timeline:
            _, usd, per_cluster = c.held_timeline[-1]
            self.usd.set(usd)
            for cluster in set(per_cluster) | set(held):
                self.gpus_held.labels(cluster).set(per_cluster.get(cluster, 0))


def queue_depths(controller: Controller) -> dict[str, int]:
    """Per node: distinct phase instances in its GPUs' FIFO queues that may run and have not started."""
    # Copies first (list() of a dict or list holds the GIL throughout): a scrape thread may call this
    # while the controller's thread runs.
    started = {key for key, run in list(controller.runs.items()) if run.permitted}
    per_node: dict[str, set] = {}
    for gpu, queue in list(controller.queues.items()):
        keys = per_node.setdefault(node_of(gpu), set())
        keys.update(list(queue.front))
        # GpuQueue keeps one heap entry per (job, phase) stream: its next instance. Reading the heap
        # here avoids a new method in executor.queues for a read-only view.
        for entry in list(getattr(queue, "_heap", ())):
            job, phase, k = entry[1], entry[2], entry[3]
            st = controller.state.get(job)
            if st is not None and k < st.limit and st.done.get(phase, -1) < k:
                keys.add((job, phase, k))
    return {node: len(keys - started) for node, keys in sorted(per_node.items())}


@dataclass
class MetricsServer:
    monitor: ControllerMonitor
    port: int
    addr: str
    _server: object
    _thread: threading.Thread
    _owned: bool  # the monitor was made here: closing the server detaches it too

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def linger(self, seconds: float, *, until_scraped: bool = True, poll_s: float = 0.05) -> float:
        """Keep serving after the run: the gauges are refreshed to the final state, then this waits
        ``seconds`` or, with ``until_scraped``, until one scrape has read the final values (whichever
        comes first). Returns the seconds waited. Ctrl-C ends the wait."""
        self.monitor.poll()
        self.monitor.refresh_state()
        start = time.monotonic()
        try:
            while time.monotonic() - start < seconds:
                # A scrape that began before the final refresh may still count after it: only one that
                # began later read the final values. Its answer is still being written: a grace period
                # before the server closes (else the scraper's connection may be reset).
                if until_scraped and self.monitor.last_scrape_began > start:
                    time.sleep(SCRAPE_GRACE_S)
                    break
                time.sleep(min(poll_s, max(0.0, seconds - (time.monotonic() - start))))
        except KeyboardInterrupt:
            pass
        return time.monotonic() - start

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        if self._owned:
            self.monitor.close()


def start_metrics_server(target: Controller | ControllerMonitor, port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve ``target``'s metrics on ``http://addr:port/metrics`` from a daemon thread (see module doc)."""
    owned = not isinstance(target, ControllerMonitor)
    monitor = ControllerMonitor(target) if owned else target
    server, thread = start_http_server(port, addr=addr, registry=monitor.registry)
    return MetricsServer(monitor, int(server.server_port), addr, server, thread, owned)


Setup = Callable[..., None]  # (controller, backend) -> None, as simulate_plan and run_trace take it


def linger_and_close(servers: list[MetricsServer], seconds: float,
                     announce: Callable[[str], None] | None = None) -> None:
    """What ``weave simulate`` / ``weave run`` do after writing their outputs (``--metrics-linger``)."""
    for server in servers:
        if seconds > 0 and announce is not None:
            announce(f"metrics stay on {server.url} for up to {seconds:g} s, until one scrape has read the "
                     "final values (--metrics-linger)")
        server.linger(seconds)
        server.close()


def metrics_setup(port: int, setup: Setup | None = None, *, addr: str = "127.0.0.1",
                  announce: Callable[[str], None] | None = None,
                  servers: list[MetricsServer] | None = None) -> Setup:
    """A ``setup`` hook that serves the controller's metrics (then runs ``setup``): what
    ``weave simulate --metrics-port`` passes to ``simulate_plan`` / ``run_trace``."""

    def hook(controller: Controller, backend) -> None:
        try:
            server = start_metrics_server(controller, port, addr)
        except OSError as exc:  # port taken, address not local: the user's to fix, one line
            raise InputError("<command line>", "--metrics-port", f"cannot serve on {addr}:{port}: "
                             f"{exc.strerror or exc}") from None
        if isinstance(getattr(backend, "events", None), list):  # a real-worker backend's log
            server.monitor.follow_worker_events(backend.events)
        if servers is not None:
            servers.append(server)
        if announce is not None:
            announce(server.url)
        if setup is not None:
            setup(controller, backend)

    return hook
