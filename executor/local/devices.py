"""Logical GPUs of a plan -> devices of this machine (``--map``).

Devices are ``cuda:N`` (when CUDA is present) or ``cpu:N`` (one per core: the worker pins itself to
core N and computes with one thread). ``--map`` names some or all GPUs explicitly,
``train-000:0=cpu:0,rollout-000:0=cpu:1``; the rest go round-robin over the available devices in
GPU-id order (several logical GPUs may then share a device, each still with its own worker).
"""

from __future__ import annotations

import os
import re
from typing import Iterable

from weave_rl.core.errors import InputError

_DEVICE = re.compile(r"^(cpu|cuda):(\d+)$")


def available_devices() -> list[str]:
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return [f"cpu:{i}" for i in range(max(1, cores))]


def map_devices(gpus: Iterable[str], spec: str | None, devices: list[str] | None = None,
                source: str = "--map") -> dict[str, str]:
    """Every GPU of ``gpus`` -> a device; ``InputError("<command line>", "--map", ...)`` on a bad spec."""
    gpus = sorted(set(gpus))
    devices = devices if devices is not None else available_devices()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    known = set(devices) | {f"cpu:{i}" for i in range(max(1, cores))}  # CPU workers also on a CUDA machine
    out: dict[str, str] = {}
    for item in (p.strip() for p in (spec or "").split(",")):
        if not item:
            continue
        gpu, eq, device = item.rpartition("=")
        gpu, device = gpu.strip(), device.strip()
        if not eq or not gpu:
            raise InputError("<command line>", source, f"bad entry {item!r}: expected GPU=DEVICE, e.g. local-000:0=cpu:1")
        if gpu not in gpus:
            raise InputError("<command line>", source, f"GPU {gpu!r} is not in the plan "
                             f"(plan GPUs: {', '.join(gpus[:6])}{', ...' if len(gpus) > 6 else ''})")
        match = _DEVICE.match(device)
        if match is None:
            raise InputError("<command line>", source, f"bad device {device!r} for {gpu}: expected cpu:N or cuda:N")
        if device not in known:
            raise InputError("<command line>", source, f"device {device!r} is not on this machine "
                             f"(available: {', '.join(devices[:8])}{', ...' if len(devices) > 8 else ''})")
        if gpu in out:
            raise InputError("<command line>", source, f"GPU {gpu!r} is mapped twice")
        out[gpu] = device
    rest = [g for g in gpus if g not in out]
    for i, g in enumerate(rest):
        out[g] = devices[i % len(devices)]
    return out
