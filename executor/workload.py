"""The phase shim: what a real RL job looks like to a worker process (DESIGN section 5).

A job is a Python object that registers its ``rollout``, ``reward`` and ``train`` functions, in the
spirit of Weave's ``@weave.phase``: subclass :class:`Workload` and decorate the methods with
:func:`phase`. Workers of the ``local`` (and later ``ray``) backend build one instance per job they
serve, from the job's ``workload`` block in the jobs file (:func:`build_workload`), and drive it:

1. warm switch: ``to_device(role, host_state, device)`` loads the job's state for a role from host
   memory (pinned on CUDA) onto the worker's device; ``to_host(role)`` offloads it again and
   returns the (possibly updated) host state;
2. ``rollout(iteration, shard, shards)``: generate this worker's share of the iteration's prompts;
   ``reward(samples)``: score them (CPU, rule-based);
3. ``train(iteration, samples, all_reduce)``: one optimisation step on this worker's share of the
   iteration's samples; ``all_reduce`` averages gradients over the phase's workers (data parallel);
4. weight sync: ``policy_weights()`` on the trainer, ``load_policy_weights(weights)`` on rollout
   workers (also when their state is offloaded: it lands in host memory, as in the plan's contract).

Everything crossing a process boundary is CPU tensors in plain dicts, so any transport (pipes,
torch.distributed, Ray objects) can carry it. Determinism: prompts depend only on
``(seed, iteration, shard, shards)``, sampling on a generator seeded from the same, so a re-run
phase after a fault produces the same samples.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch

Role = Literal["rollout", "train"]
HostState = dict[str, torch.Tensor]
AllReduce = Callable[[list[torch.Tensor]], None]  # in place, average over the phase's workers

PHASE_ATTR = "_weave_phase"


def phase(name: Literal["rollout", "reward", "train"]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a Workload method as the job's ``rollout``, ``reward`` or ``train`` function."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, PHASE_ATTR, name)
        return fn

    return mark


@dataclass
class Samples:
    """One worker's share of one iteration's rollout: batch-first CPU tensors plus counts."""

    job: str
    iteration: int
    shard: int
    shards: int
    data: dict[str, torch.Tensor]  # e.g. prompt ids, response ids, masks, old log-probs, rewards
    count: int  # responses in this shard
    tokens: int  # generated tokens in this shard
    ids: list[str] = field(default_factory=list)  # one stable id per response: "job/iteration/shard/index"
    stats: dict[str, float] = field(default_factory=dict)  # e.g. mean reward


class Workload(ABC):
    """Base class of a real job. One instance per (worker process, job)."""

    def __init__(self, job: str, options: Mapping[str, Any], seed: int) -> None:
        self.job = job
        self.options = dict(options)
        self.seed = seed

    # -- state movement (warm switch) ------------------------------------------------------------
    @abstractmethod
    def initial_state(self, role: Role) -> HostState:
        """Fresh host state for a role (same seed -> same weights in every process)."""

    @abstractmethod
    def to_device(self, role: Role, state: HostState, device: torch.device) -> None:
        """Warm-load the role's state onto ``device``."""

    @abstractmethod
    def to_host(self, role: Role) -> HostState:
        """Offload the role's state from the device; returns the host copy and frees the device."""

    @abstractmethod
    def state_bytes(self, role: Role) -> int:
        """Bytes a warm switch moves for the role."""

    # -- weight sync --------------------------------------------------------------------------------
    @abstractmethod
    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The trainer's current policy weights (CPU tensors), what a weight sync sends."""

    @abstractmethod
    def load_policy_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Install synced weights for the rollout role, on device or in the host copy."""

    # -- phases: subclasses decorate their implementations with @phase ------------------------------
    def phases(self) -> dict[str, Callable[..., Any]]:
        found: dict[str, Callable[..., Any]] = {}
        for name in dir(type(self)):
            fn = getattr(type(self), name, None)
            tag = getattr(fn, PHASE_ATTR, None)
            if tag is not None:
                if tag in found:
                    raise TypeError(f"{type(self).__name__} registers two {tag} functions")
                found[tag] = getattr(self, name)
        missing = {"rollout", "reward", "train"} - set(found)
        if missing:
            raise TypeError(f"{type(self).__name__} registers no {', '.join(sorted(missing))} function")
        return found


WorkloadFactory = Callable[[str, Mapping[str, Any], int], Workload]
_REGISTRY: dict[str, WorkloadFactory] = {}
# Built-in kinds: the module whose import registers each. Looked up by name, like a plugin, so that
# this contract stays below the workloads that implement it (no import cycle).
BUILTIN_KINDS = {"grpo": "weave_rl.executor.rl", "bandit": "weave_rl.executor.local.toy"}


def register_workload(kind: str) -> Callable[[WorkloadFactory], WorkloadFactory]:
    """Make a Workload class available under ``workload: {kind: NAME}`` in jobs files."""

    def add(factory: WorkloadFactory) -> WorkloadFactory:
        _REGISTRY[kind] = factory
        return factory

    return add


def workload_factory(kind: str) -> WorkloadFactory:
    """The factory registered for ``kind``, importing a built-in kind's module on first use.

    Raises ``ValueError`` naming the known kinds, or the reason a built-in kind cannot be loaded."""
    if kind not in _REGISTRY and kind in BUILTIN_KINDS:
        try:
            importlib.import_module(BUILTIN_KINDS[kind])
        except ImportError as exc:
            raise ValueError(f"the built-in {kind} workload is not available ({exc})") from None
    if kind not in _REGISTRY:
        known = ", ".join(sorted(set(_REGISTRY) | set(BUILTIN_KINDS)))
        raise ValueError(f"unknown workload kind {kind!r} (known: {known})")
    return _REGISTRY[kind]


def build_workload(job: str, block: Mapping[str, Any] | None, *, default_seed: int = 0) -> Workload:
    """The Workload for a job's ``workload`` block (``{kind: grpo, ...}``; grpo when absent)."""
    block = dict(block or {})
    kind = str(block.pop("kind", "grpo"))
    seed = int(block.pop("seed", default_seed))
    return workload_factory(kind)(job, block, seed)
