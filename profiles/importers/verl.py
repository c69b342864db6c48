"""veRL: ``timing_s/*`` (or, before veRL renamed them, ``timing/*``) metrics of ``RayPPOTrainer.fit()``
-> Weave phases.

Formats: the console logger's ``step:N - key:value - key:value`` lines (values as ``pprint``
writes them, ``np.float64(1.5)`` included; a Ray prefix such as ``(TaskRunner pid=1)``, ANSI colour
and tqdm ``\\r`` redraws on the same line are fine), the same metrics one ``key:value`` per line
under a ``step:N`` line, the file logger's JSON lines ``{"step": N, "data": {...}}``, or a tracking
export (CSV, one row per step, a ``step``/``_step`` column).

| veRL key (``timing_s/`` or ``timing/``)     | Weave                                  |
|--------------------------------------------|----------------------------------------|
| ``gen``                                    | rollout ``duration_s``                 |
| ``reward`` + ``old_log_prob`` + ``ref`` + ``values`` + ``adv`` + ``update_critic`` + ``update_actor`` | train ``duration_s`` |
| ``update_weights``                         | sync ``duration_s`` (no row when absent or 0) |
| ``step``                                   | step length, for ``start_s`` of the next step |
| ``timing_s/gen`` / ``timing_per_token_ms/gen`` | rollout ``tokens`` (veRL divides gen by response tokens) |

A step uses one generation of keys: ``timing_s/X`` when present, else ``timing/X``.
Reward and advantage go to train: once ``gen`` returns, the rollout engines are idle (asleep or
waiting for weights); scoring, log-probs and the updates run on the trainer pool or the driver and
hold up the next sync, not the rollout GPUs. ``gen_max``, ``testing`` and ``save_checkpoint`` are
not per-iteration work and are left out. veRL logs no warm-switch time: ``switch_s`` is 0.

GPU counts: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` for train; with a separate rollout
pool (fully_async / one_step_off_policy, ``actor_rollout_ref.hybrid_engine`` false)
``rollout.nnodes`` x ``rollout.n_gpus_per_node`` for rollout and sync, else rollout shares the
training GPUs (hybrid engine; a rollout pool of 0 nodes is no pool). Looked up in ``--config``, the
config file beside the log, then what the log prints itself: the resolved config ``main_ppo`` pprints
at start (``{'actor_rollout_ref': ..., 'trainer': {...}}`` over several lines), else the Hydra
overrides of the command line (``trainer.nnodes=1 trainer.n_gpus_per_node=8 ...``; ``trainer.nnodes``
defaults to 1 there, as in veRL's ``ppo_trainer.yaml``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from weave_rl.profiles.importers.base import total
from weave_rl.profiles.importers.builder import StepPhases
from weave_rl.profiles.importers.config import lookup, positive_int
from weave_rl.profiles.importers.metrics import StepMetrics, number, python_literal
from weave_rl.core.errors import InputError

NAME = "verl"
TITLE = "veRL"

TRAIN_TIMERS = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
GENERATIONS = ("timing_s/", "timing/")  # today's prefix, then the one veRL logged before


def _terms(prefix: str, names: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple((prefix + n,) for n in names)


ROLLOUT = (("timing_s/gen",),)
TRAIN = _terms("timing_s/", TRAIN_TIMERS)
SYNC = (("timing_s/update_weights",),)

# ``(?<![\w/.])``: the line may follow a tqdm redraw without a space ("... 1/3 [02:07<04:14, 127.40s/it]step:2 - ...")
_LINE = re.compile(r"(?<![\w/.])step:(\d+)((?: - [^ ]+:[^ ]*)*)\s*$")
_LOOSE = re.compile(r"(?<![\w/.])step:\d+ - ")  # looks like a metrics line even if it does not parse


CONFIG_DUMP = "\x00veRL config dump"  # join_lines' stand-in for the lines of a printed config


def parse_console(line: str) -> tuple[int, dict[str, float]] | None:
    if line == CONFIG_DUMP:
        raise ValueError("the run's printed config, not a step")
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
    prefix = next((p for p in GENERATIONS if p + "gen" in m), None)
    if prefix is None:
        raise ValueError("step without timing_s/gen (or timing/gen)")
    rollout = m[prefix + "gen"]
    train, used = total(m, _terms(prefix, TRAIN_TIMERS))
    if not used:
        raise ValueError(f"step without training timers ({prefix}update_actor, old_log_prob, ...)")
    if rollout <= 0 or train <= 0:
        raise ValueError(f"non-positive phase time (gen {rollout:g} s, train {train:g} s)")
    per_token = m.get("timing_per_token_ms/gen", 0.0)
    tokens = round(rollout * 1000 / per_token) if per_token > 0 else None
    return StepPhases(step.line, step.step, rollout, train, sync_s=max(m.get(prefix + "update_weights", 0.0), 0.0),
                      tokens=tokens, step_s=m.get(prefix + "step"))


# ----- one key per line: "step:3" then "timing_s/gen:130.0", ... (a Ray prefix on each is fine) -----
_RAY_PREFIX = re.compile(r"^\s*\([\w.:-]+ pid=\d+(?:, ip=[\d.]+)?\)\s?")
_BLOCK_START = re.compile(r"^\s*step:(\d+)\s*-?\s*$")
_BLOCK_ITEM = re.compile(r"^\s*(?:-\s*)?([^\s:]+):\s*(\S+)\s*$")


def join_lines(parts: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Fold a ``step:N`` line and the ``key:value`` lines right under it into one console line, and a
    printed config (several lines) into one line, skipped once as the config."""
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(parts):
        number_, line = parts[i]
        end, config = _config_dump_at(parts, i)
        if config is not None:
            out.append((number_, CONFIG_DUMP))
            i = end
            continue
        start = _BLOCK_START.match(_RAY_PREFIX.sub("", line))
        i += 1
        if start is None:
            out.append((number_, line))
            continue
        items = []
        while i < len(parts):
            item = _BLOCK_ITEM.match(_RAY_PREFIX.sub("", parts[i][1]))
            if item is None or item.group(1) == "step":
                break
            items.append(f"{item.group(1)}:{item.group(2)}")
            i += 1
        out.append((number_, " - ".join([f"step:{start.group(1)}", *items])))
    return out


# ----- the config the log prints: main_ppo's pprint of the resolved config, or the command line -----
_OVERRIDE = re.compile(r"(?:^|\s)\+{0,2}((?:trainer|rollout)\.(?:nnodes|n_gpus_per_node|experiment_name)"
                       r"|actor_rollout_ref\.hybrid_engine)=(\"[^\"]*\"|'[^']*'|\S+)")


def configs_in_log(lines: list[tuple[int, str]]) -> list[tuple[dict, str]]:
    found: list[tuple[dict, str]] = []
    dump = _printed_config(lines)
    if dump is not None:
        found.append(dump)
    for number_, line in lines:
        overrides = {k: v.strip("'\"") for k, v in (m.groups() for m in _OVERRIDE.finditer(line))}
        # a count that is not a number ("$GPUS" echoed by a script before expansion) says nothing
        overrides = {k: v for k, v in overrides.items() if not k.endswith(("nnodes", "n_gpus_per_node")) or v.isdigit()}
        if any(k.startswith("trainer.") and k != "trainer.experiment_name" for k in overrides):
            config: dict[str, Any] = dict(overrides)
            if "trainer.n_gpus_per_node" in config:
                config.setdefault("trainer.nnodes", "1")  # veRL's default (ppo_trainer.yaml)
            found.append((config, f"the command line at line {number_}"))
            break
    return found


def _printed_config(lines: list[tuple[int, str]]) -> tuple[dict, str] | None:
    """The first multi-line dict dump that has a ``trainer`` section with ``n_gpus_per_node``."""
    i = 0
    while i < len(lines):
        j, data = _config_dump_at(lines, i)
        if data is not None:
            return data, f"the config printed at line {lines[i][0]}"
        i = max(j, i + 1)
    return None


def _config_dump_at(lines: list[tuple[int, str]], i: int) -> tuple[int, dict | None]:
    """(index after the dump, the config) when a veRL config dump starts at ``lines[i]``, else (i + 1, None)."""
    text = _RAY_PREFIX.sub("", lines[i][1])
    if not text.lstrip().startswith("{") or "'" not in text:
        return i + 1, None
    chunk, depth, j = [], 0, i
    while j < len(lines) and j < i + 5000:
        piece = _RAY_PREFIX.sub("", lines[j][1])
        chunk.append(piece)
        depth += piece.count("{") + piece.count("[") - piece.count("}") - piece.count("]")
        j += 1
        if depth <= 0:
            break
    data = python_literal("\n".join(chunk))
    trainer = data.get("trainer") if isinstance(data, dict) else None
    if isinstance(trainer, dict) and isinstance(trainer.get("n_gpus_per_node"), int):
        return j, data
    return j, None


def gpu_counts(config: Mapping[str, Any], file: str) -> tuple[int | None, int | None]:
    train = _product(config, "trainer", file)
    hybrid = lookup(config, "actor_rollout_ref.hybrid_engine")
    if hybrid is True or str(hybrid).lower() == "true":
        return None, train  # one pool: rollout shares the training GPUs whatever rollout.* says
    if lookup(config, "rollout.nnodes") in (0, "0"):
        return None, train  # a rollout pool of 0 nodes is no pool
    rollout = _product(config, "rollout", file)
    return rollout, train


def job_name(config: Mapping[str, Any]) -> str | None:
    name = lookup(config, "trainer.experiment_name")
    return str(name) if name else None


def _product(config: Mapping[str, Any], section: str, file: str) -> int | None:
    nodes = positive_int(config, f"{section}.nnodes", file)
    per_node = positive_int(config, f"{section}.n_gpus_per_node", file)
    return nodes * per_node if nodes and per_node else None
