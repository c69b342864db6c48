"""OpenRLHF: the PPO trainer's ``timing/*`` status keys -> Weave phases.

Formats: JSON lines of the logged status (flat, with ``global_step`` / ``train/global_step``, as
the wandb and tensorboard loggers see it; the ``train/`` prefix wandb adds is dropped) or a
tracking export (CSV with a ``train/global_step``, ``global_step`` or ``step`` column). OpenRLHF's
console shows these keys only in a tqdm bar, which is not read.

| OpenRLHF key                                        | Weave                    |
|-----------------------------------------------------|--------------------------|
| ``timing/generation``                               | rollout ``duration_s``   |
| ``timing/make_experience`` + ``timing/ppo_train`` (or ``timing/policy_train``) | train ``duration_s`` |
| ``timing/broadcast``                                | sync ``duration_s``      |
| ``timing/step_total``                               | step length              |

``make_experience`` (reward-model, reference and critic forward passes, advantages) runs on the
actor/critic/reward GPUs after generation, so it is train time. Some OpenRLHF versions time the
generation *inside* ``make_experience``: when generation + make_experience + train + broadcast
exceed ``timing/step_total`` by more than 1 %, generation is taken out of make_experience. No
switch time (0) and no token count are logged.

GPU counts: ``actor.num_nodes`` x ``actor.num_gpus_per_node`` for train and ``vllm.num_engines`` x
``vllm.tensor_parallel_size`` for rollout (the older flat names ``actor_num_nodes``,
``vllm_num_engines``, ... too), from the args saved as YAML/JSON next to the log.
"""

from __future__ import annotations

from typing import Any, Mapping

from weave_rl.profiles.importers.base import total
from weave_rl.profiles.importers.builder import StepPhases
from weave_rl.profiles.importers.config import lookup, positive_int
from weave_rl.profiles.importers.metrics import StepMetrics

NAME = "openrlhf"
TITLE = "OpenRLHF"

ROLLOUT = (("timing/generation",),)
TRAIN = (("timing/make_experience",), ("timing/ppo_train", "timing/policy_train"))
SYNC = (("timing/broadcast",),)


def parse_console(line: str) -> tuple[int, dict[str, float]] | None:
    return None  # OpenRLHF prints its timings only inside a tqdm bar


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
    if step_total and "timing/make_experience" in m and rollout + train + sync > 1.01 * step_total:
        train -= rollout  # generation was timed inside make_experience
    if rollout <= 0 or train <= 0:
        raise ValueError(f"non-positive phase time (generation {rollout:g} s, train {train:g} s)")
    return StepPhases(step.line, step.step, rollout, train, sync_s=sync, step_s=step_total)


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
