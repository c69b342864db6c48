"""Connecting to Ray, placement groups per topology node, and explicit device indices.

``--address``: omitted (or ``local``) starts a private Ray instance on this machine for the run and
stops it afterwards; ``auto`` joins the cluster a ``ray start`` on this machine belongs to; ``HOST:PORT``
joins the cluster whose head (GCS) listens there. A bad address is a one-line ``InputError`` (exit 2),
checked with a plain TCP connect before Ray is asked, and ``ray.init`` gets ``connect_timeout_s``
(30 s) to join: it retries for ever when the head advertises an address this machine cannot reach
(Ray rewrites a loopback ``--address`` to the host's interface).

Listeners: a private instance's GCS and raylet listen on every interface whatever ``ray.init`` is
told; Ray's token authentication (on by default since Ray 2.5x) guards them. The run's own channels
(torch.distributed rendezvous, gloo) stay on loopback (``weave_rl.executor.local.comm``).

Placement: one placement group per topology node the plan uses, one bundle per logical GPU of that
node (``{"CPU": 1}``, plus ``{"GPU": 1}`` when the cluster has GPUs), strategy ``STRICT_PACK``, so a
topology node is exactly one Ray node and its GPUs are reserved while the run lasts. Devices are not
left to Ray's ``num_gpus`` accounting: actors take no GPU resource, see every device of their Ray node
(``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``), and are told theirs: the logical GPUs placed on one
Ray node, in GPU-id order, get ``cuda:0``, ``cuda:1``, ... (``cpu:N`` on a node without GPUs, N modulo
its CPUs). The run folder records the mapping (``ray_placement.json``).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from dataclasses import dataclass, field

from weave_rl.core.errors import InputError

_HOSTPORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")


def check_address(address: str | None, *, connect_timeout_s: float = 3.0) -> None:
    """``InputError`` for an address that cannot be a Ray cluster (format, or nothing listening)."""
    if address is None or address in ("local", "auto"):
        return
    if address.startswith("ray://"):
        raise InputError("<command line>", "--address", "Ray client addresses (ray://) are not supported: run "
                         "weave run on a node of the cluster with --address HEAD:6379 or auto")
    match = _HOSTPORT.match(address)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise InputError("<command line>", "--address", f"expected auto or HOST:PORT (e.g. 10.0.0.1:6379), "
                         f"got {address!r}")
    host = match["host"].strip("[]")
    try:
        with socket.create_connection((host, int(match["port"])), timeout=connect_timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__ if not isinstance(exc, socket.timeout) else "timed out"
        raise InputError("<command line>", "--address", f"no Ray cluster reachable at {address} ({reason}); "
                         "start one with `ray start --head`") from None


def connect(address: str | None, *, num_cpus: int | None = None, connect_timeout_s: float = 30.0) -> bool:
    """Make sure this process is a Ray driver; True when it started (and so must stop) Ray."""
    import ray

    if ray.is_initialized():
        return False
    check_address(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": True}
    if address is None or address == "local":
        ray.init(address="local", num_cpus=num_cpus, **quiet)
        return True
    try:
        _init_within(connect_timeout_s, address=address, **quiet)
    except TimeoutError:
        raise InputError("<command line>", "--address", f"the Ray cluster at {address} did not let this machine "
                         f"join within {connect_timeout_s:g} s (its head may advertise an address this machine "
                         "cannot reach; see Ray's log lines above)") from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if address == "auto":
            reason = "no running Ray cluster found on this machine (start one with `ray start --head`)"
        else:
            reason = f"could not join the Ray cluster at {address}: {first}"
        raise InputError("<command line>", "--address", reason) from None
    return True


_STUCK: list[threading.Thread] = []  # ray.init calls given up on (still running in their thread)


def init_left_running() -> bool:
    """Whether a ``ray.init`` this process gave up on is still running (the CLI then exits at once)."""
    return any(t.is_alive() for t in _STUCK)


def _init_within(timeout_s: float, **kwargs) -> None:
    """``ray.init(**kwargs)``, or ``TimeoutError`` after ``timeout_s`` (the stuck call is left in a
    daemon thread: the process exits with its error all the same)."""
    import ray

    outcome: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            ray.init(**kwargs)
            outcome["error"] = None
        except BaseException as exc:  # noqa: BLE001  handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=init, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "error" not in outcome:
        _STUCK.append(thread)
        raise TimeoutError(timeout_s)
    if outcome["error"] is not None:
        raise outcome["error"]


@dataclass
class NodePlacement:
    """One topology node: its placement group and the Ray node it landed on."""

    node: str
    gpus: list[str]  # logical GPUs, bundle order
    bundles: list[dict]
    pg: object = None
    ray_node: str = ""
    ip: str = ""
    devices: dict[str, str] = field(default_factory=dict)


def bundle_for(cluster_has_gpus: bool) -> dict:
    return {"CPU": 1, "GPU": 1} if cluster_has_gpus else {"CPU": 1}


def assign_devices(placements: list[NodePlacement], node_resources: dict[str, dict]) -> dict[str, str]:
    """Logical GPU -> device on its Ray node: cuda:i (or cpu:i mod CPUs) in GPU-id order per Ray node."""
    by_ray_node: dict[str, list[str]] = {}
    for p in placements:
        by_ray_node.setdefault(p.ray_node, []).extend(p.gpus)
    out: dict[str, str] = {}
    for ray_node, gpus in by_ray_node.items():
        res = node_resources.get(ray_node, {})
        n_gpu, n_cpu = int(res.get("GPU", 0)), max(1, int(res.get("CPU", 1)))
        for i, g in enumerate(sorted(gpus)):
            out[g] = f"cuda:{i % n_gpu}" if n_gpu else f"cpu:{i % n_cpu}"
    for p in placements:
        p.devices = {g: out[g] for g in p.gpus}
    return out


def check_backend_options(backend: str, address: str | None, device_map: str | None) -> str:
    """``weave run``'s ``--backend`` / ``--address`` / ``--map`` checked together; returns the backend."""
    if backend not in ("local", "ray"):
        raise InputError("<command line>", "--backend", f"expected local or ray, got {backend!r}")
    if backend == "local":
        if address is not None:
            raise InputError("<command line>", "--address", "only with --backend ray")
        return backend
    if device_map:
        raise InputError("<command line>", "--map", "the ray backend assigns devices per Ray node "
                         "(see ray_placement.json); leave --map out")
    check_address(address)
    return backend
