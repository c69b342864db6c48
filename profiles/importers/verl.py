"""veRL: ``timing_s/*`` metrics of ``RayPPOTrainer.fit()`` -> Weave phases.

Formats: the console logger's ``step:N - key:value - key:value`` lines (values as ``pprint``
writes them, ``np.float64(1.5)`` included; a Ray prefix such as ``(TaskRunner pid=1)`` is fine),
the file logger's JSON lines ``{"step": N, "data": {...}}``, or a tracking export (CSV, one row per
step, a ``step``/``_step`` column).

| veRL key                                   | Weave                                  |
|--------------------------------------------|----------------------------------------|
| ``timing_s/gen``                           | rollout ``duration_s``                 |
| ``timing_s/reward`` + ``old_log_prob`` + ``ref`` + ``values`` + ``adv`` + ``update_critic`` + ``update_actor`` | train ``duration_s`` |
| ``timing_s/update_weights``                | sync ``duration_s`` (no row when absent or 0) |
| ``timing_s/step``                          | step length, for ``start_s`` of the next step |
| ``timing_s/gen`` / ``timing_per_token_ms/gen`` | rollout ``tokens`` (veRL divides gen by response tokens) |

Reward and advantage go to train: once ``gen`` returns, the rollout engines are idle (asleep or
waiting for weights); scoring, log-probs and the updates run on the trainer pool or the driver and
hold up the next sync, not the rollout GPUs. ``gen_max``, ``testing`` and ``save_checkpoint`` are
not per-iteration work and are left out. veRL logs no warm-switch time: ``switch_s`` is 0.

GPU counts: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` for train; with a separate rollout
pool (fully_async / one_step_off_policy) ``rollout.nnodes`` x ``rollout.n_gpus_per_node`` for
rollout and sync, else rollout shares the training GPUs (hybrid engine).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from weave_rl.profiles.importers.base import total
from weave_rl.profiles.importers.builder import StepPhases
from weave_rl.profiles.importers.config import lookup, positive_int
from weave_rl.profiles.importers.metrics import StepMetrics, number

NAME = "verl"
TITLE = "veRL"

ROLLOUT = (("timing_s/gen",),)
TRAIN = (("timing_s/reward",), ("timing_s/old_log_prob",), ("timing_s/ref",), ("timing_s/values",),
         ("timing_s/adv",), ("timing_s/update_critic",), ("timing_s/update_actor",))
SYNC = (("timing_s/update_weights",),)

_LINE = re.compile(r"(?:^|\s)step:(\d+)((?: - [^ ]+:[^ ]*)*)\s*$")
_LOOSE = re.compile(r"(?:^|\s)step:\d+ - ")  # looks like a metrics line even if it does not parse


def parse_console(line: str) -> tuple[int, dict[str, float]] | None:
    match = _LINE.search(line)
    if match is None:
        if _LOOSE.search(line):
            raise ValueError("malformed veRL metrics line (expected step:N - key:value - ...)")
        return None
    metrics = {}
    for item in match.group(2).split(" - ")[1:]:
        key, _, value = item.rpartition(":")
        try:
            metrics[key] = number(value)
        except ValueError:
            if key.startswith("timing"):  # a timing we cannot read: the step is not trustworthy
                raise ValueError(f"unreadable value {value!r} for {key}") from None
    return int(match.group(1)), metrics


def phases(step: StepMetrics) -> StepPhases:
    m = step.metrics
    if "timing_s/gen" not in m:
        raise ValueError("step without timing_s/gen")
    rollout = m["timing_s/gen"]
    train, used = total(m, TRAIN)
    if not used:
        raise ValueError("step without training timers (timing_s/update_actor, old_log_prob, ...)")
    if rollout <= 0 or train <= 0:
        raise ValueError(f"non-positive phase time (gen {rollout:g} s, train {train:g} s)")
    per_token = m.get("timing_per_token_ms/gen", 0.0)
    tokens = round(rollout * 1000 / per_token) if per_token > 0 else None
    return StepPhases(step.line, step.step, rollout, train, sync_s=max(total(m, SYNC)[0], 0.0),
                      tokens=tokens, step_s=m.get("timing_s/step"))


def gpu_counts(config: Mapping[str, Any], file: str) -> tuple[int | None, int | None]:
    train = _product(config, "trainer", file)
    rollout = _product(config, "rollout", file)
    return rollout, train


def job_name(config: Mapping[str, Any]) -> str | None:
    name = lookup(config, "trainer.experiment_name")
    return str(name) if name else None


def _product(config: Mapping[str, Any], section: str, file: str) -> int | None:
    nodes = positive_int(config, f"{section}.nnodes", file)
    per_node = positive_int(config, f"{section}.n_gpus_per_node", file)
    return nodes * per_node if nodes and per_node else None
