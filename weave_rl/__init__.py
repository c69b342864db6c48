"""Weave: co-scheduler for disaggregated RL post-training.

Everything of this distribution imports under ``weave_rl``:

- ``weave_rl.core``: errors, YAML I/O (below every layer);
- ``weave_rl.topology``, ``weave_rl.profiles``, ``weave_rl.planner``, ``weave_rl.executor``: the
  layers, in that order (each imports only the ones before it);
- ``weave_rl.cli``: the ``weave`` command (no library module imports it).

The names below are the public API, imported on first use so that ``import weave_rl`` stays cheap
(a user's ``Workload`` subclass needs torch, a planning script does not)::

    from weave_rl import Workload, phase, OptionError             # a job of your own
    from weave_rl import load_topology, load_jobs, make_plan, check_plan, save_plan
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC = {
    "Workload": "weave_rl.executor.workload",
    "Samples": "weave_rl.executor.workload",
    "RolloutCancelled": "weave_rl.executor.workload",
    "OptionError": "weave_rl.executor.workload",
    "phase": "weave_rl.executor.workload",
    "register_workload": "weave_rl.executor.workload",
    "load_topology": "weave_rl.topology.topology",
    "load_jobs": "weave_rl.profiles.jobs",
    "make_plan": "weave_rl.planner.api",
    "check_plan": "weave_rl.planner.check",
    "load_plan": "weave_rl.planner.plan",
    "save_plan": "weave_rl.planner.plan",
    "InputError": "weave_rl.core.errors",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'weave_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
