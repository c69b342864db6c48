"""OpenRLHF: the PPO trainers' ``timing/*`` status keys -> Weave phases.

Formats: the trainers' console lines ``... ✨ Global step N: {...}`` (the synchronous ``PPOTrainer``;
the async ``PPOTrainerAsync`` prints ``Global step N: {...}`` and replay rounds ``Global step N
[replay]: {...}``; the dict as Python prints it, behind any logger or Ray prefix); JSON lines of the
logged status (flat, with ``global_step`` / ``train/global_step``, as the wandb and tensorboard
loggers see it; the ``train/`` prefix wandb adds is dropped); or a tracking export (CSV with a
``train/global_step``, ``global_step`` or ``step`` column).

| OpenRLHF key                                        | Weave                    |
|-----------------------------------------------------|--------------------------|
| ``timing/generation``                               | rollout ``duration_s``   |
| ``timing/make_experience`` + ``timing/ppo_train`` (or ``timing/policy_train``) | train ``duration_s`` |
| ``timing/broadcast``                                | sync ``duration_s``      |
| ``timing/step_total``                               | step length              |

``make_experience`` (reward-model, reference and critic forward passes, advantages) runs on the
actor/critic/reward GPUs after generation, so it is train time. No switch time (0) and no token
count are logged.

Synchronous trainer: the phases run one after the other and today's ``timing/step_total`` is their
sum. Some older versions timed the generation *inside* ``make_experience``: when generation +
make_experience + train + broadcast exceed ``timing/step_total`` by more than 1 %, generation is
taken out of make_experience.

Async trainer (``--train.async_enable``; recognised by the ``Global step`` line without ✨, by its
``timing/vllm_idle_wait`` / ``timing/actor_idle_wait`` keys, or by ``train.async_enable`` /
``async_train`` in the config): generation of the next batch runs while a batch trains, and
``timing/step_total`` is the trainer's wall time per step (queue wait included), not a sum of
phases. Nothing is taken out of make_experience there; the step is laid out overlapped (rollout
ending where train starts, train and broadcast ending with the step's wall time; see
``builder``).

GPU counts: ``actor.num_nodes`` x ``actor.num_gpus_per_node`` for train and ``vllm.num_engines`` x
``vllm.tensor_parallel_size`` for rollout (the older flat names ``actor_num_nodes``,
``vllm_num_engines``, ... too), from the args saved as YAML/JSON next to the log.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Mapping

from weave_rl.profiles.importers.base import total
from weave_rl.profiles.importers.builder import StepPhases
from weave_rl.profiles.importers.config import lookup, positive_int
from weave_rl.profiles.importers.metrics import StepMetrics, number, python_literal

NAME = "openrlhf"
TITLE = "OpenRLHF"

ROLLOUT = (("timing/generation",),)
TRAIN = (("timing/make_experience",), ("timing/ppo_train", "timing/policy_train"))
SYNC = (("timing/broadcast",),)
ASYNC_KEYS = ("timing/vllm_idle_wait", "timing/actor_idle_wait")
ASYNC_MARK = "weave/async_trainer"  # set on a step read from the async trainer's line form

_GLOBAL_STEP = re.compile(r"(✨\s*)?Global step (\d+)(?: \[[\w-]+\])?:\s*(\{.*)$")


def parse_console(line: str) -> tuple[int, dict[str, float]] | None:
    match = _GLOBAL_STEP.search(line)
    if match is None:
        return None
    status = python_literal(match.group(3))
    if not isinstance(status, dict):
        raise ValueError("unreadable Global step status (expected a dict as Python prints it)")
    metrics: dict[str, float] = {}
    for key, value in status.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # generated samples, lists, None
        try:
            metrics[str(key)] = number(value)
        except ValueError:
            continue
    if match.group(1) is None:
        metrics[ASYNC_MARK] = 1.0
    return int(match.group(2)), metrics


def is_async(step: StepMetrics, configs: list[Mapping[str, Any]] = ()) -> bool:
    m = step.metrics
    if ASYNC_MARK in m or any(k in m or f"train/{k}" in m for k in ASYNC_KEYS):
        return True
    for config in configs:
        for key in ("train.async_enable", "async_train"):
            flag = lookup(config, key)
            if flag is True or str(flag).lower() == "true":
                return True
    return False


def prepare(steps: list[StepMetrics], configs: list[Mapping[str, Any]]) -> list[StepMetrics]:
    """Mark the steps of an async run (a config flag applies to every step of the log)."""
    return [replace(s, metrics={**s.metrics, ASYNC_MARK: 1.0}) if is_async(s, configs) else s for s in steps]


def phases(step: StepMetrics) -> StepPhases:
    m = {k.removeprefix("train/"): v for k, v in step.metrics.items()}
    if "timing/generation" not in m:
        raise ValueError("step without timing/generation")
    rollout = m["timing/generation"]
    train, used = total(m, TRAIN)
    if not used:
        raise ValueError("step without training timers (timing/make_experience, timing/ppo_train)")
    sync = max(total(m, SYNC)[0], 0.0)
    step_total = m.get("timing/step_total")
    overlapped = ASYNC_MARK in m
    if (not overlapped and step_total and "timing/make_experience" in m
            and rollout + train + sync > 1.01 * step_total):
        train -= rollout  # generation was timed inside make_experience
    if rollout <= 0 or train <= 0:
        raise ValueError(f"non-positive phase time (generation {rollout:g} s, train {train:g} s)")
    return StepPhases(step.line, step.step, rollout, train, sync_s=sync, step_s=step_total, overlapped=overlapped)


def notes(steps: list[StepMetrics], configs: list[Mapping[str, Any]]) -> list[str]:
    n = sum(ASYNC_MARK in s.metrics for s in steps)
    if not n:
        return []
    return [f"{n} step{'s' if n != 1 else ''} of the async trainer: timing/step_total is wall time over overlapping "
            "phases, so each rollout is placed to end where its train starts (overlapping the previous step)"]


def gpu_counts(config: Mapping[str, Any], file: str) -> tuple[int | None, int | None]:
    train = _product(config, ("actor.num_nodes", "actor_num_nodes"),
                     ("actor.num_gpus_per_node", "actor_num_gpus_per_node"), file)
    rollout = _product(config, ("vllm.num_engines", "vllm_num_engines"),
                       ("vllm.tensor_parallel_size", "vllm_tensor_parallel_size"), file)
    return rollout, train


def job_name(config: Mapping[str, Any]) -> str | None:
    name = lookup(config, "logger.wandb.run_name") or lookup(config, "wandb_run_name")
    return str(name) if name else None


def _product(config: Mapping[str, Any], a: tuple[str, str], b: tuple[str, str], file: str) -> int | None:
    x = next((v for v in (positive_int(config, k, file) for k in a) if v), None)
    y = next((v for v in (positive_int(config, k, file) for k in b) if v), None)
    return x * y if x and y else None
