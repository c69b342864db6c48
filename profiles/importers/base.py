"""What every framework importer provides, and the one function that runs any of them.

A framework module (``verl``, ``roll``, ``openrlhf``) supplies: how to read its console lines,
how one step's metrics map onto Weave's phases, and where its config keeps the GPU counts. The
reading, skip accounting, GPU types and record building are shared here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

import pandas as pd

from weave_rl.profiles.importers.builder import Placement, StepPhases, build_records
from weave_rl.profiles.importers.config import find_config, load_config
from weave_rl.profiles.importers.metrics import LineParser, StepMetrics, physical_lines, read_log_text, read_steps
from weave_rl.core.errors import InputError

CLI = "<command line>"


class Importer(Protocol):
    NAME: str  # as the CLI spells it: verl, roll, openrlhf
    TITLE: str  # as the project spells it, for messages: veRL, ROLL, OpenRLHF
    parse_console: LineParser

    def phases(self, step: StepMetrics) -> StepPhases:
        """The step's phase times; ValueError (a short reason) when the step has none usable."""

    def gpu_counts(self, config: Mapping[str, Any], config_file: str) -> tuple[int | None, int | None]:
        """(rollout GPUs, train GPUs) from the config, ``None`` where it does not say."""

    def job_name(self, config: Mapping[str, Any]) -> str | None:
        """The run's name in the config, if any."""

    # Optional, looked up with getattr:
    #   join_lines(parts) -> parts                      regroup physical lines (metrics.LineJoiner)
    #   configs_in_log(lines) -> [(config, label), ...]  configs the log prints itself (dump, command line)
    #   prepare(steps, configs) -> steps                 mark steps from what the configs say (before phases)
    #   notes(steps, configs) -> [warning, ...]          warnings about the steps as a whole


@dataclass(frozen=True)
class ImportOptions:
    job: str | None = None
    gpu_type: str | None = None  # "H800" for every phase, or "rollout=H20,train=H800"
    config: Path | None = None
    rollout_gpus: int | None = None
    train_gpus: int | None = None


@dataclass(frozen=True)
class ImportResult:
    records: pd.DataFrame
    job: str
    placement: Placement
    log_format: str
    config_file: str | None
    warnings: list[str] = field(default_factory=list)


def import_log(importer: Importer, log: Path, options: ImportOptions) -> ImportResult:
    file = str(log)
    raw, skipped, log_format = read_steps(log, importer.parse_console, importer.TITLE,
                                          getattr(importer, "join_lines", None))
    configs = config_sources(importer, log, options.config)
    prepare = getattr(importer, "prepare", None)
    if prepare is not None:
        raw = prepare(raw, [c for c, _ in configs])
    steps: list[StepPhases] = []
    seen: dict[int, int] = {}
    for item in raw:
        if item.step in seen:
            skipped.add(item.line, f"step {item.step} again (first at line {seen[item.step]}; the first is kept)")
            continue
        try:
            phases = importer.phases(item)
        except ValueError as exc:
            skipped.add(item.line, str(exc))
            continue
        seen[item.step] = item.line
        steps.append(phases)
    if not steps:
        reasons = "; ".join(skipped.warnings(shown=3)) or "the file is empty"
        raise InputError(file, None, f"no usable {importer.TITLE} step ({reasons})")
    placement, config_file = _placement(importer, configs, options, file)
    job = options.job or next((n for n in (importer.job_name(c) for c, _ in configs) if n), None) or log.stem
    records = build_records(job, sorted(steps, key=lambda s: s.step), placement, file)
    warnings = skipped.warnings()
    notes = getattr(importer, "notes", None)
    if notes is not None:
        warnings += notes([r for r in raw if seen.get(r.step) == r.line], [c for c, _ in configs])
    from weave_rl.topology.catalog import BUILTIN_GPU_TYPES

    for name in dict.fromkeys((placement.rollout_gpu_type, placement.train_gpu_type)):
        if name not in BUILTIN_GPU_TYPES:
            warnings.append(f"--gpu-type {name!r} is not in the built-in catalog ({', '.join(sorted(BUILTIN_GPU_TYPES))}); "
                            "weave profile fit will need --topology with a topology file that defines it")
    return ImportResult(records, job, placement, log_format, config_file, warnings)


def config_sources(importer: Importer, log: Path, given: Path | None) -> list[tuple[dict, str]]:
    """The run's configs, first match first: ``--config``; the config file beside the log; the config
    the log prints itself (veRL's resolved Hydra dump, then its command line)."""
    sources: list[tuple[dict, str]] = []
    path = find_config(log, given)
    if path is not None:
        sources.append((load_config(path), str(path)))
    in_log = getattr(importer, "configs_in_log", None)
    if in_log is not None and log.suffix.lower() not in (".csv", ".tsv"):
        sources += [(c, label) for c, label in in_log(physical_lines(read_log_text(log))) if c]
    return sources


def _placement(importer: Importer, configs: list[tuple[dict, str]], options: ImportOptions,
               log_file: str) -> tuple[Placement, str | None]:
    rollout = train = None
    used = None
    for config, label in configs:
        if not config:
            continue
        rollout, train = importer.gpu_counts(config, label)
        if train is not None:
            used = label
            break
    rollout = options.rollout_gpus or rollout
    train = options.train_gpus or train
    if train is None:
        where = (f"{', '.join(label for _, label in configs)} {'has' if len(configs) == 1 else 'have'} no training "
                 "GPU count" if configs else "no config found next to the log, nor printed in it")
        raise InputError(log_file, None, f"GPU counts unknown: {where} (give --config FILE or --train-gpus N)")
    rollout = rollout or train  # no separate rollout pool: rollout runs on the training GPUs (colocated)
    rollout_type, train_type = parse_gpu_types(options.gpu_type)
    return Placement(rollout, train, rollout_type, train_type), used


def parse_gpu_types(text: str | None) -> tuple[str, str]:
    """``H800`` -> (H800, H800); ``rollout=H20,train=H800`` -> (H20, H800)."""
    if not text or not text.strip():
        raise InputError(CLI, "--gpu-type", "required: logs do not record the GPU model "
                         "(e.g. --gpu-type H800, or --gpu-type rollout=H20,train=H800)")
    if "=" not in text:
        return text.strip(), text.strip()
    types: dict[str, str] = {}
    for part in text.split(","):
        role, sep, name = (p.strip() for p in part.partition("="))
        if not sep or role not in ("rollout", "train") or not name:
            raise InputError(CLI, "--gpu-type", f"expected TYPE or rollout=TYPE,train=TYPE (got {text!r})")
        types[role] = name
    if set(types) != {"rollout", "train"}:
        raise InputError(CLI, "--gpu-type", f"name both rollout= and train= (got {text!r})")
    return types["rollout"], types["train"]


def total(metrics: Mapping[str, float], terms: tuple[tuple[str, ...], ...]) -> tuple[float, list[str]]:
    """Sum over ``terms`` of the first key of each term present; also the keys used."""
    value, used = 0.0, []
    for aliases in terms:
        key = next((k for k in aliases if k in metrics), None)
        if key is not None:
            value += metrics[key]
            used.append(key)
    return value, used
