"""Refit a jobs file from measured records (``weave profile fit``).

For every job and phase (rollout, train) that has records:

- the reference point is the job's own (gpus, gpu_type) if it was measured there, else the
  (gpus, gpu_type) with the most rows (ties: the job's GPU type first, then fewer GPUs); the
  phase's ``gpus`` and ``gpu_type`` move to that point;
- ``duration_s`` becomes ``{p50, p95, max}`` of the samples at the reference point (numpy
  quantiles, so the lognormal model reproduces them exactly at 0.5, 0.95 and ``max``), or a
  plain number when there is a single sample;
- if several GPU counts were measured on the reference GPU type, ``scaling`` becomes
  ``{gpus: sorted counts, duration_s: median per count}``.

An elastic rollout row (one with the real backend's ``shares`` column given) contributes its
``width_s`` -- the pulled-schedule makespan of its prompt groups on its planned GPUs alone -- not its
wall time ``duration_s``, which lending shortened and migration lengthened: the simulator applies
those itself (``executor/sim.py``), so a wall-time fit would count them twice. The elastic model
itself (tail share, lending gain) is fitted by ``profiles/elastic_fit.py``.

A row with an ``after_s`` column (the real backends') adds it: the time the phase kept its devices
after its work ended (writing its samples, copying the weights for the sync, the trainer's
checkpoint). The plan has no other term for it, and it is part of every iteration.

Sync rows with the plan's ``planned_s`` (the real backends' records) set the job's
``sync_overhead_s``: what the syncs took beyond the plan's sync, median over the rows, added to the
overhead the plan already counted (the network part stays the topology's model, so it follows the
job to other placements).

Phases and jobs without records stay as they are. ``reward`` rows, and sync rows without
``planned_s``, are accepted but ignored: reward is folded into rollout, and sync is computed from
the topology. Any other phase name, or a job missing from the jobs file, is an
``InputError`` naming the records file.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
from pydantic import ValidationError

from weave_rl.profiles.jobs import PHASES, JobSet, PhaseSpec, phase_to_data
from weave_rl.profiles.records import validate_records
from weave_rl.topology.catalog import GpuType
from weave_rl.core.errors import InputError, Problem, Problems

KNOWN_PHASES = ("rollout", "train", "reward", "sync")


def fit_jobs(
    records: pd.DataFrame,
    jobs: JobSet,
    *,
    records_file: str = "<records>",
    gpu_types: Mapping[str, GpuType] | None = None,
) -> JobSet:
    """The job set with durations (and scaling tables) refitted from ``records``.

    ``gpu_types``, when given, must know the GPU type of every rollout and train row.
    """
    frame = validate_records(records, records_file,
                             check=lambda f: row_problems(f, jobs, records_file, gpu_types))
    frame = _planned_durations(frame)
    fitted = []
    for job in jobs.jobs:
        updates = {}
        for name in PHASES:
            rows = frame[(frame["job"] == job.name) & (frame["phase"] == name)]
            if len(rows):
                try:
                    updates[name] = _fit_phase(job.phase(name), rows)
                except ValueError as exc:  # records that make no valid phase (checked records should not)
                    raise InputError(records_file, f"job {job.name}.{name}", str(exc)) from None
        syncs = frame[(frame["job"] == job.name) & (frame["phase"] == "sync")]
        if len(syncs) and "planned_s" in frame.columns:
            beyond = (syncs["duration_s"] - pd.to_numeric(syncs["planned_s"], errors="coerce")).dropna()
            if len(beyond):
                updates["sync_overhead_s"] = max(0.0, job.sync_overhead_s + float(beyond.median()))
        fitted.append(job.model_copy(update=updates) if updates else job)
    return JobSet(jobs=fitted)


def _planned_durations(frame: pd.DataFrame) -> pd.DataFrame:
    """``duration_s`` as the plan sees a phase (module doc): an elastic rollout row's planned-GPU
    ``width_s`` instead of its wall time, plus ``after_s`` where the records have it."""
    from weave_rl.profiles.elastic_fit import elastic_rows

    frame = frame.copy()
    rows = elastic_rows(frame).index
    if len(rows) and "width_s" in frame.columns:
        width = pd.to_numeric(frame.loc[rows, "width_s"], errors="coerce")
        frame.loc[rows, "duration_s"] = width.where(width > 0, frame.loc[rows, "duration_s"])
    if "after_s" in frame.columns:
        after = pd.to_numeric(frame["after_s"], errors="coerce")
        frame["duration_s"] = frame["duration_s"] + after.where(after > 0, 0.0).fillna(0.0)
    return frame


def _fit_phase(phase: PhaseSpec, rows: pd.DataFrame) -> PhaseSpec:
    gpus, gpu_type = _reference_point(phase, rows)
    at_ref = rows[(rows["gpus"] == gpus) & (rows["gpu_type"] == gpu_type)]["duration_s"].to_numpy()
    if len(at_ref) == 1:
        duration = float(at_ref[0])
    else:
        duration = {
            "p50": float(np.quantile(at_ref, 0.5)),
            "p95": float(np.quantile(at_ref, 0.95)),
            "max": float(at_ref.max()),
        }
    data = phase_to_data(phase)
    if phase.gpu_options == (phase.gpus,):
        data.pop("gpu_options", None)  # a default option follows the new reference point
    if phase.gpu_types == (phase.gpu_type,):
        data.pop("gpu_types", None)
    data.update(gpus=gpus, gpu_type=gpu_type, duration_s=duration)
    same_type = rows[rows["gpu_type"] == gpu_type]
    counts = sorted(int(g) for g in same_type["gpus"].unique())
    if len(counts) > 1:
        medians = same_type.groupby("gpus")["duration_s"].median()
        data["scaling"] = {"gpus": counts, "duration_s": [float(medians[g]) for g in counts]}
    try:
        return PhaseSpec.model_validate({"kind": phase.kind, **data})
    except ValidationError as exc:  # cannot happen with checked records; say so if it does
        raise ValueError(f"fitted phase is invalid: {exc}") from None


def _reference_point(phase: PhaseSpec, rows: pd.DataFrame) -> tuple[int, str]:
    points = rows.groupby(["gpus", "gpu_type"]).size()
    if (phase.gpus, phase.gpu_type) in points.index:
        return phase.gpus, phase.gpu_type
    ranked = sorted(points.items(), key=lambda kv: (-kv[1], kv[0][1] != phase.gpu_type, kv[0][0], kv[0][1]))
    (gpus, gpu_type), _ = ranked[0]
    return int(gpus), str(gpu_type)


def row_problems(
    frame: pd.DataFrame, jobs: JobSet, file: str, gpu_types: Mapping[str, GpuType] | None
) -> list[Problem]:
    """Every unknown phase, job and GPU type of the records, each value once with its rows (numbered by
    the frame's index)."""
    names = set(jobs.names)
    found: dict[tuple[str, str], list[int]] = {}
    for row, job, phase, gpu_type in zip(frame.index, frame["job"], frame["phase"], frame["gpu_type"]):
        row = int(row)  # the frame's index is the row number (validate_records resets it)
        if phase not in KNOWN_PHASES:
            found.setdefault(("phase", phase), []).append(row)
        if job not in names:
            found.setdefault(("job", job), []).append(row)
        if gpu_types is not None and phase in PHASES and gpu_type not in gpu_types:
            found.setdefault(("gpu_type", gpu_type), []).append(row)
    problems = Problems(file)
    for (column, value), rows in found.items():
        if column == "phase":
            reason = f"unknown phase {value!r} (expected {', '.join(KNOWN_PHASES)})"
        elif column == "job":
            reason = f"job {value!r} is not in the jobs file (jobs: {', '.join(jobs.names) or 'none'})"
        else:
            reason = f"unknown GPU type {value!r} (known: {', '.join(sorted(gpu_types or {}))})"
        if len(rows) > 1:
            others = ", ".join(map(str, rows[1:10])) + (", ..." if len(rows) > 10 else "")
            reason += f"; also row{'s' if len(rows) > 2 else ''} {others} ({len(rows)} rows in all)"
        problems.add(f"row {rows[0]}.{column}", reason)
    return problems.items
