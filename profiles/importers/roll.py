"""ROLL: the pipeline's ``time/*`` metrics -> Weave phases.

Formats: the stdout tracker's log lines ``... metrics_tag: {"step": N, "metrics": {...}}``, the
same objects as JSON lines, or a tracking export (CSV with a ``step`` column).

| ROLL key                                                        | Weave                       |
|-----------------------------------------------------------------|-----------------------------|
| ``time/step_generate`` (or ``time/step_rollout``, ``time/rollout``) | rollout ``duration_s``  |
| ``time/ref_log_probs_values`` (or ``..._reward``) + ``time/old_log_probs`` (or ``..._values``) + ``time/get_sample_level_mask`` + ``time/compute_advantage`` (or ``time/adv``) + ``time/reward_postprocess`` + ``time/get_token_reward`` + ``time/step_train`` | train ``duration_s`` |
| ``<domain>/time/compute_advantage``, ``<domain>/time/reward_postprocess``, ``<domain>/time/get_token_reward`` | train ``duration_s``, summed over domains (the RLVR pipeline times them per domain) |
| ``time/step_model_update``                                      | sync ``duration_s``; ROLL runs it at the *start* of its step (the previous step's weights), so the sync row starts the step |
| ``time/<cluster>/<method>/onload`` + ``.../offload``            | ``switch_s`` of the phase that cluster serves: ``actor_infer*``, ``reward*`` -> rollout; ``actor_train*``, ``reference*``, ``critic*`` -> train |

ROLL's ``state_offload_manager`` runs the onload and offload inside the worker call that the step
timer wraps, so the switch time is taken out of ``duration_s`` (Weave keeps the warm switch apart,
as the executor does); a step whose switch time is not below its timers is skipped. ROLL logs the
onload/offload timers only at debug level: without them ``switch_s`` is 0 and a warning says so.
``time/step_stop_server`` (pausing the async pipeline's generation) and ``time/val_step`` are left out. Rewards are
scored inside ROLL's generate scheduler, so they are part of ``time/step_generate`` (rollout).
``time/step_total`` is the *previous* step's total in ROLL and is not used. No token count.

GPU counts: ``len(actor_infer.device_mapping)`` for rollout and sync, ``len(actor_train.device_mapping)``
for train (``list(range(a,b))`` strings, as ROLL writes them, or lists).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Mapping

from weave_rl.profiles.importers.base import total
from weave_rl.profiles.importers.builder import StepPhases
from weave_rl.profiles.importers.config import lookup
from weave_rl.profiles.importers.metrics import StepMetrics, flat_metrics
from weave_rl.core.errors import InputError

NAME = "roll"
TITLE = "ROLL"

ROLLOUT = (("time/step_generate", "time/step_rollout", "time/rollout"),)
TRAIN = (("time/ref_log_probs_values", "time/ref_log_probs_values_reward"),
         ("time/old_log_probs", "time/old_log_probs_values"), ("time/get_sample_level_mask",),
         ("time/compute_advantage", "time/adv"), ("time/reward_postprocess",), ("time/get_token_reward",),
         ("time/step_train",))
DOMAIN_TIMERS = ("compute_advantage", "reward_postprocess", "get_token_reward")
SYNC = (("time/step_model_update",),)
ROLLOUT_CLUSTERS = ("actor_infer", "reward")
TRAIN_CLUSTERS = ("actor_train", "reference", "critic")

_SWITCH = re.compile(r"^time/(.+)/[^/]+/(onload|offload)$")
_DOMAIN = re.compile(r"^[^/]+/time/(" + "|".join(DOMAIN_TIMERS) + r")$")
_RANGE = re.compile(r"^\s*list\(\s*range\(\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)\s*\)\s*$")


def parse_console(line: str) -> tuple[int, dict[str, float]] | None:
    _, tag, rest = line.partition("metrics_tag:")
    if not tag:
        return None
    try:
        data = json.loads(rest.strip())
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed metrics_tag JSON: {exc.msg}") from None
    except RecursionError:
        raise ValueError("metrics_tag JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("metrics_tag is not a JSON object")
    return flat_metrics(data)


def phases(step: StepMetrics) -> StepPhases:
    m = step.metrics
    rollout, used = total(m, ROLLOUT)
    if not used:
        raise ValueError("step without time/step_generate")
    train, used = total(m, TRAIN)
    per_domain = [k for k in m if _DOMAIN.match(k)]
    train += sum(m[k] for k in per_domain)
    if not used and not per_domain:
        raise ValueError("step without training timers (time/step_train, time/old_log_probs, ...)")
    rollout_switch, train_switch = _switches(m)
    if rollout - rollout_switch <= 0 or train - train_switch <= 0:
        raise ValueError(f"onload/offload time not below the step timers (rollout {rollout:g} s incl. "
                         f"{rollout_switch:g} s switch, train {train:g} s incl. {train_switch:g} s)")
    return StepPhases(step.line, step.step, rollout - rollout_switch, train - train_switch,
                      sync_s=max(total(m, SYNC)[0], 0.0), rollout_switch_s=rollout_switch,
                      train_switch_s=train_switch, sync_first=True)


def notes(steps: list[StepMetrics], configs: list[Mapping[str, Any]]) -> list[str]:
    missing = [s.step for s in steps if not any(_SWITCH.match(k) for k in s.metrics)]
    if not missing:
        return []
    which = "no step logs" if len(missing) == len(steps) else f"{len(missing)} of {len(steps)} steps log no"
    return [f"{which} onload/offload timers (time/<cluster>/<method>/onload|offload; ROLL logs them only at "
            "debug level): switch_s taken as 0 there, so the switch stays inside the phase times"]


def _switches(metrics: Mapping[str, float]) -> tuple[float, float]:
    rollout = train = 0.0
    for key, value in metrics.items():
        match = _SWITCH.match(key)
        if match is None:
            continue
        cluster = match.group(1)
        if cluster.startswith(ROLLOUT_CLUSTERS):
            rollout += value
        elif cluster.startswith(TRAIN_CLUSTERS):
            train += value
    return rollout, train


def gpu_counts(config: Mapping[str, Any], file: str) -> tuple[int | None, int | None]:
    infer = device_mapping(lookup(config, "actor_infer.device_mapping"), "actor_infer.device_mapping", file)
    train = device_mapping(lookup(config, "actor_train.device_mapping"), "actor_train.device_mapping", file)
    return (len(infer) if infer else None), (len(train) if train else None)


def job_name(config: Mapping[str, Any]) -> str | None:
    name = lookup(config, "exp_name")
    return str(name) if name else None


MAX_RANK = 1_000_000  # GPU ranks past any cluster: a typo, not a placement


def device_mapping(value: Any, key: str, file: str) -> list[int] | None:
    """ROLL's ``device_mapping``: ``list(range(a,b[,s]))``, a list literal, or a YAML list (never eval'd)."""
    if value is None:
        return None
    if isinstance(value, str):
        match = _RANGE.match(value)
        if match:
            a, b, s = int(match.group(1)), int(match.group(2)), int(match.group(3) or "1")
            if s == 0 or max(a, b) > MAX_RANK:
                raise InputError(file, key, f"expected list(range(a,b[,s])) with a step > 0 and ranks up to "
                                 f"{MAX_RANK:,} (got {value!r})")
            value = list(range(a, b, s))
        else:
            try:
                value = ast.literal_eval(value.strip()[:100_000])
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                raise InputError(file, key, f"expected list(range(a,b)) or a list of GPU ranks (got {value[:80]!r})") from None
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_RANK for r in value):
        shown = repr(value)
        raise InputError(file, key, f"expected a list of GPU ranks >= 0 (got {shown[:80] + ('...' if len(shown) > 80 else '')})")
    return list(value)
