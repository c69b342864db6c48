"""The sim backend's elastic model fitted from real elastic rollout records (``weave profile fit
--elastic-out``), and the file that carries it to ``weave simulate --elastic-model``.

Which rows: rollout rows that carry the elastic columns a real backend writes (``shares`` and
``tail_share`` given; static runs leave them empty). Per job, and over all jobs for ``default``:

- ``tail_share``: the median of the rows' ``tail_share`` (computed by ``prompt_groups.pulled_schedule``
  from the measured prompt groups: the share of the planned-GPU makespan left once the threshold share
  of groups is done, the very quantity ``SimModel.tail_share`` stands for).
- ``tail_slowdown``: fixed at 1.0, not fitted. The records hold no tail wall time (no threshold
  timestamp), so the tail cannot be separated from the bulk in ``duration_s``; and a real backend's
  migration keeps every GPU that is computing a prompt group (``Controller.threshold_reached``), so a
  tail's groups go on where they run, at the same speed, unless one is taken back (``shares_taken_back``
  counts those; the fit prints their share of rows so a user can see when 1.0 is doubtful).
- ``lend_gain``: the share of a lent GPU's time that became rollout progress. From the rows that were
  lent GPUs (``gpus_peak > gpus``) and started on all their planned GPUs (``gpus_at_start >= gpus``, so
  no late start muddles ``duration_s``): with ``D = width_s`` (the pulled-schedule makespan on the
  planned GPUs alone), ``W = duration_s``, ``ts = tail_share``, ``n = gpus``, ``p = gpus_peak``, a
  proportional speed-up with the ``p`` GPUs held through the bulk predicts
  ``W_prop = ts * D + (1 - ts) * D * n / p``; the row's gain is ``(D - W) / (D - W_prop)`` clamped to
  [0, 1], the fit the median of its rows. A loan that joined late makes the gain read low (the
  prediction assumes it was there all bulk long): a conservative estimate. Without lent rows the job
  gets the default's value, and the default then is None (the simulator's own default applies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from weave_rl.core.errors import InputError, Problems

ELASTIC_COLUMNS = ("shares", "tail_share", "gpus_peak", "gpus_at_start", "shares_taken_back", "wasted_gpu_s",
                   "share_s_max", "share_s_mean")
PARAMS = ("tail_share", "tail_slowdown", "lend_gain")


@dataclass(frozen=True)
class ElasticParams:
    """The sim backend's elastic model of one job (defaults: ``executor/sim.py``'s module doc)."""
    tail_share: float = 0.3  # share of a rollout's time after the threshold share of responses
    tail_slowdown: float = 1.05  # the tail's slowdown on fewer GPUs than planned
    # Share of a lent GPU's speed that becomes bulk progress. 1.0 (the proportional model) is the
    # default only because no measurement was at hand; fit it from real records.
    lend_gain: float = 1.0

    def problems(self) -> list[tuple[str, str]]:
        """(key, reason) of every value out of its range."""
        ranges = {"tail_share": (lambda x: 0 <= x < 1, "0 <= tail_share < 1"),
                  "tail_slowdown": (lambda x: x >= 1, "tail_slowdown >= 1"),
                  "lend_gain": (lambda x: 0 <= x <= 1, "0 <= lend_gain <= 1")}
        out = []
        for key, (ok, text) in ranges.items():
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                out.append((key, f"expected a finite number (got {value!r})"))
            elif not ok(value):
                out.append((key, f"expected {text} (got {value})"))
        return out


@dataclass(frozen=True)
class ElasticFit:
    default: dict[str, float | None]  # None: not identified by these records
    jobs: dict[str, dict[str, float | None]] = field(default_factory=dict)
    rows: int = 0  # elastic rollout rows used
    lent_rows: int = 0
    taken_back_rows: int = 0


def elastic_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rollout rows that carry the elastic columns (none from a static run)."""
    if "shares" not in frame.columns or "tail_share" not in frame.columns:
        return frame.iloc[0:0]
    rows = frame[frame["phase"] == "rollout"]
    shares = pd.to_numeric(rows["shares"], errors="coerce")
    tail = pd.to_numeric(rows["tail_share"], errors="coerce")
    return rows[shares.notna() & tail.notna()]


def row_lend_gain(width_s: float, duration_s: float, tail_share: float, gpus: int, gpus_peak: int) -> float:
    """One lent row's gain (module doc): measured saving over the proportional model's, in [0, 1]."""
    d, w = float(width_s), float(duration_s)
    predicted = tail_share * d + (1 - tail_share) * d * gpus / gpus_peak
    saving = d - predicted
    if saving <= 0:
        return math.nan  # the model predicts no saving: the row says nothing about the gain
    return min(1.0, max(0.0, (d - w) / saving))


def _column(rows: pd.DataFrame, name: str, fill: float) -> pd.Series:
    if name not in rows.columns:
        return pd.Series(fill, index=rows.index, dtype=float)
    return pd.to_numeric(rows[name], errors="coerce").fillna(fill).astype(float)


def _fit_rows(rows: pd.DataFrame) -> dict[str, float | None]:
    gpus = rows["gpus"].astype(float)
    peak = _column(rows, "gpus_peak", math.nan).fillna(gpus)
    at_start = _column(rows, "gpus_at_start", math.nan).fillna(gpus)
    lent = rows[(peak > gpus) & (at_start >= gpus)]
    gains = [row_lend_gain(r.width_s, r.duration_s, float(r.tail_share), int(r.gpus), int(p))
             for r, p in zip(lent.itertuples(), peak[lent.index])]
    gains = [g for g in gains if not math.isnan(g)]
    return {"tail_share": float(np.median(rows["tail_share"].astype(float))),
            "tail_slowdown": 1.0,  # not identifiable from the records (module doc)
            "lend_gain": float(np.median(gains)) if gains else None}


def fit_elastic(frame: pd.DataFrame, records_file: str = "<records>") -> ElasticFit | None:
    """The elastic model of a checked records frame, or None when it has no elastic rollout rows."""
    rows = elastic_rows(frame)
    if not len(rows):
        return None
    if "width_s" not in rows.columns or rows["width_s"].isna().any():
        raise InputError(records_file, "width_s", "elastic rollout rows need width_s (the planned-GPU makespan)")
    default = _fit_rows(rows)
    jobs = {}
    for name in sorted(rows["job"].unique()):
        fitted = _fit_rows(rows[rows["job"] == name])
        if fitted["lend_gain"] is None:
            fitted["lend_gain"] = default["lend_gain"]
        jobs[str(name)] = fitted
    gpus = rows["gpus"].astype(float)
    lent = int(((_column(rows, "gpus_peak", math.nan).fillna(gpus)) > gpus).sum())
    taken = int((_column(rows, "shares_taken_back", 0.0) > 0).sum())
    return ElasticFit(default, jobs, len(rows), lent, taken)


def elastic_model_data(fit: ElasticFit, source: str) -> dict[str, Any]:
    """The YAML document ``--elastic-out`` writes (None values are left out: not identified)."""
    def clean(params: Mapping[str, float | None]) -> dict[str, float]:
        return {k: round(v, 6) for k, v in params.items() if v is not None}

    return {"elastic_model": {"default": clean(fit.default), "jobs": {j: clean(p) for j, p in fit.jobs.items()},
                              "source": source, "rows": fit.rows}}


def load_elastic_model(path: str | Path, jobs: list[str] | None = None,
                       base: ElasticParams = ElasticParams()) -> tuple[ElasticParams, dict[str, ElasticParams]]:
    """Read an ``--elastic-out`` file: (default, per-job) params; missing keys fall back to ``base`` (for
    ``default``) and to the default (for a job). Every problem of the file at once, as an ``InputError``."""
    from weave_rl.core.yamlio import load_yaml_file

    file = str(path)
    data = load_yaml_file(path)
    problems = Problems(file)
    model = data.get("elastic_model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        raise InputError(file, "elastic_model", "expected a mapping (the file `weave profile fit --elastic-out` writes)")
    for key in sorted(set(model) - {"default", "jobs", "source", "rows"}):
        problems.add(f"elastic_model.{key}", "unknown key (expected default, jobs, source, rows)")

    def params(value: Any, key: str, fallback: ElasticParams) -> ElasticParams:
        if value is None:
            return fallback
        if not isinstance(value, dict):
            problems.add(key, "expected a mapping of tail_share, tail_slowdown, lend_gain")
            return fallback
        for k in sorted(set(value) - set(PARAMS)):
            problems.add(f"{key}.{k}", f"unknown key (expected {', '.join(PARAMS)})")
        p = replace(fallback, **{k: v for k, v in value.items() if k in PARAMS})
        for k, reason in p.problems():
            if k in value:  # an inherited value was reported where it was set
                problems.add(f"{key}.{k}", reason)
        return p

    default = params(model.get("default"), "elastic_model.default", base)
    per_job: dict[str, ElasticParams] = {}
    listed = model.get("jobs") or {}
    if not isinstance(listed, dict):
        problems.add("elastic_model.jobs", "expected a mapping of job name to parameters")
        listed = {}
    for name, value in listed.items():
        key = f"elastic_model.jobs.{name}"
        if jobs is not None and str(name) not in jobs:
            problems.add(key, f"job {name!r} is not in the jobs file (jobs: {', '.join(jobs) or 'none'})")
        per_job[str(name)] = params(value, key, default)
    problems.raise_if_any()
    return default, per_job


def describe(params: Mapping[str, float | None]) -> str:
    return ", ".join(f"{k} {'-' if params.get(k) is None else f'{params[k]:.3f}'}" for k in PARAMS)


__all__ = ["ELASTIC_COLUMNS", "ElasticFit", "ElasticParams", "describe", "elastic_model_data",
           "elastic_rows", "fit_elastic", "load_elastic_model", "row_lend_gain"]
