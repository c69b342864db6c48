"""The phase shim: what a real RL job looks like to a worker process (DESIGN section 5).

A job is a Python object that registers its ``rollout``, ``reward`` and ``train`` functions, in the
spirit of Weave's ``@weave.phase``: subclass :class:`Workload` and decorate the methods with
:func:`phase`. Workers of the ``local`` (and later ``ray``) backend build one instance per job they
serve, from the job's ``workload`` block in the jobs file (:func:`build_workload`), and drive it:

1. warm switch: ``to_device(role, host_state, device)`` loads the job's state for a role from host
   memory (pinned on CUDA) onto the worker's device; ``to_host(role)`` offloads it again and
   returns the (possibly updated) host state;
2. ``rollout(iteration, shard, shards)``: generate the share ``shard`` of ``shards`` of the
   iteration's prompts (a prompt group: with elastic rules a worker pulls one share after another,
   ``shards`` fixed per job, so a share does not depend on which worker runs it); long decodes check
   ``check_cancelled()`` between steps; ``reward(samples)``: score them (CPU, rule-based);
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
from pathlib import Path
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


class RolloutCancelled(Exception):
    """Raised inside ``rollout`` once ``Workload.cancelled()`` is true: the backend took the prompt
    group back (long-tail migration moved it to the GPUs that stay), nothing of it is kept."""


class Workload(ABC):
    """Base class of a real job. One instance per (worker process, job)."""

    def __init__(self, job: str, options: Mapping[str, Any], seed: int) -> None:
        self.job = job
        self.options = dict(options)
        self.seed = seed
        self._cancel_check: Callable[[], bool] | None = None  # set by the worker around each rollout call

    # -- cancellation (elastic rollouts) ----------------------------------------------------------
    def cancelled(self) -> bool:
        """True once the backend has taken the running ``rollout`` call's prompt group back (long-tail
        migration: the group is regenerated from its seeds on a GPU that stays). A rollout that decodes
        step by step should call ``check_cancelled()`` between steps; one that never checks is still
        correct, its GPU is just handed over when the call returns (and what it made is dropped)."""
        check = self._cancel_check
        return check is not None and check()

    def check_cancelled(self) -> None:
        """Raise ``RolloutCancelled`` when ``cancelled()``."""
        if self.cancelled():
            raise RolloutCancelled(f"{self.job}: rollout taken back")

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

    # -- options, checked in the controller -----------------------------------------------------
    @classmethod
    def check_options(cls, options: Mapping[str, Any], base: Path) -> Mapping[str, Any] | None:
        """Check the job's options in the controller process, before any worker starts.

        Raise ``OptionError(key, reason)`` for a bad option (the user sees one line naming the jobs
        file and ``jobs[i].workload.<key>``). Return the options the workers get (e.g. a relative path
        made absolute against ``base``, the jobs file's folder), or None to pass them unchanged.
        The default accepts every option: a subclass that reads options should override it."""
        return None

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
# Built-in kinds, by import string like a plugin: this contract stays below the workloads that
# implement it (no import cycle), and a kind resolves even when its module was imported before the
# registry was reset.
BUILTIN_KINDS = {"grpo": "weave_rl.executor.rl.grpo:GRPOWorkload", "bandit": "weave_rl.executor.local.toy:Bandit",
                 "longtail": "weave_rl.executor.local.longtail:LongTail"}
# Installed packages offer kinds here: ``[project.entry-points."weave.workloads"] my_kind = "pkg.mod:Cls"``.
ENTRY_POINT_GROUP = "weave.workloads"


class OptionError(ValueError):
    """A bad option of a workload block: ``key`` is its path inside the block (``dataset``,
    ``reward``), ``reason`` the one-line why. The controller turns it into an ``InputError``
    naming ``jobs[i].workload.<key>`` before any worker starts."""

    def __init__(self, key: str, reason: str, message: str | None = None) -> None:
        self.key = key
        self.reason = reason
        super().__init__(message or f"option {key!r}: {reason}")  # what a worker-side error says


def register_workload(kind: str) -> Callable[[WorkloadFactory], WorkloadFactory]:
    """Make a Workload class available under ``workload: {kind: NAME}`` in jobs files.

    Registration happens in the process that imports the module: a kind a worker process must
    build is better named by an import string (``pkg.module:Class``) or an entry point, which every
    process resolves by itself."""

    def add(factory: WorkloadFactory) -> WorkloadFactory:
        _REGISTRY[kind] = factory
        return factory

    return add


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def workload_class_problem(obj: Any) -> str | None:
    """Why ``obj`` cannot serve as a workload kind (None when it can): it must be a concrete
    ``Workload`` subclass registering one rollout, one reward and one train function."""
    if not (isinstance(obj, type) and issubclass(obj, Workload)):
        what = type(obj).__name__ if not isinstance(obj, type) else f"class {obj.__qualname__}"
        return f"is not a weave_rl.Workload subclass (it is a {what})"
    abstract = sorted(getattr(obj, "__abstractmethods__", ()))
    if abstract:
        return f"does not implement {', '.join(abstract)} (abstract methods of Workload)"
    tags: dict[str, list[str]] = {}
    for name in dir(obj):
        tag = getattr(getattr(obj, name, None), PHASE_ATTR, None)
        if tag is not None:
            tags.setdefault(tag, []).append(name)
    for tag, names in sorted(tags.items()):
        if len(names) > 1:
            return f"registers two {tag} functions ({', '.join(names)})"
    missing = {"rollout", "reward", "train"} - set(tags)
    if missing:
        return f"registers no {', '.join(sorted(missing))} function (decorate it with @phase)"
    return None


def _load_object(kind: str, target: str, origin: str) -> WorkloadFactory:
    """The Workload class at ``module:attr`` (attr may be dotted), checked."""
    module_name, _, attr = target.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise ValueError(f"{origin} {target!r} is not of the form package.module:ClassName")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = (" (is its folder on PYTHONPATH, or its package installed?)"
                if exc.name and module_name.startswith(exc.name) else "")
        raise ValueError(f"{origin} {kind!r}: cannot import {module_name!r} ({_one_line(exc)}){hint}") from None
    except Exception as exc:  # noqa: BLE001  any error of the user's module at import time
        raise ValueError(f"{origin} {kind!r}: importing {module_name!r} failed ({_one_line(exc)})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{origin} {kind!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    why = workload_class_problem(obj)
    if why:
        raise ValueError(f"{origin} {kind!r}: {target} {why}")
    return obj


def workload_factory(kind: str) -> WorkloadFactory:
    """The factory for ``kind``: a registered name, a built-in kind (its module imported on first
    use), an import string ``package.module:Class``, or a name of the ``weave.workloads``
    entry-point group. Every process resolves it by itself (worker processes included).

    Raises ``ValueError`` with the one-line reason (unknown kind, import failure, not a Workload)."""
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    if kind in BUILTIN_KINDS:
        module_name, _, attr = BUILTIN_KINDS[kind].partition(":")
        try:
            _REGISTRY[kind] = getattr(importlib.import_module(module_name), attr)
        except ImportError as exc:
            raise ValueError(f"the built-in {kind} workload is not available ({exc})") from None
    elif ":" in kind:
        _REGISTRY[kind] = _load_object(kind, kind, "workload kind")
    else:
        points = _entry_points()
        if kind in points:
            _REGISTRY[kind] = _load_object(kind, points[kind].value, f"entry point ({ENTRY_POINT_GROUP})")
    if kind not in _REGISTRY:
        known = ", ".join(sorted(set(_REGISTRY) | set(BUILTIN_KINDS) | set(_entry_points())))
        raise ValueError(f"unknown workload kind {kind!r} (known: {known}; or an import string "
                         "package.module:ClassName)")
    return _REGISTRY[kind]


def split_block(block: Mapping[str, Any] | None, default_seed: int = 0) -> tuple[str, int, dict[str, Any]]:
    """``(kind, seed, options)`` of a job's ``workload`` block (grpo when absent)."""
    block = dict(block or {})
    kind = str(block.pop("kind", "grpo"))
    seed = block.pop("seed", default_seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise OptionError("seed", f"must be an integer, got {seed!r}")
    return kind, seed, block


def check_workload(block: Mapping[str, Any] | None, base: Path) -> dict[str, Any] | None:
    """Check a job's workload block in the controller process, before any worker starts.

    Resolves the kind (``ValueError``: the kind cannot be used), then lets the kind check its options
    through its ``check_options`` classmethod (``OptionError`` naming the option). Returns the block
    the workers get: ``kind`` and ``seed`` as given, the options as ``check_options`` returned them
    (e.g. relative paths made absolute against ``base``, the jobs file's folder)."""
    kind, _, options = split_block(block)
    factory = workload_factory(kind)
    check = getattr(factory, "check_options", None)
    checked = check(options, base) if check is not None else None
    if block is None and not checked:  # no block: nothing the workers need changed
        return None
    out = {k: v for k, v in dict(block or {}).items() if k in ("kind", "seed")}
    out.update(options if checked is None else checked)
    return out


def build_workload(job: str, block: Mapping[str, Any] | None, *, default_seed: int = 0) -> Workload:
    """The Workload for a job's ``workload`` block (``{kind: grpo, ...}``; grpo when absent)."""
    kind, seed, options = split_block(block, default_seed)
    return workload_factory(kind)(job, options, seed)
