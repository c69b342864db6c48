"""Read a run folder (what ``weave simulate --out DIR`` and ``weave run`` write) for the report.

Required: ``records.parquet`` (else ``records.csv``) and ``metrics.json``. Optional, found when
present: the plan the run started from (``--plan``, else ``DIR/plan.yaml``, else
``metrics.json: inputs.plan`` as given on the command line, tried from the current folder and
from DIR), the jobs file (``--jobs``, ``DIR/jobs.yaml``, ``inputs.jobs``) for profile fits, and
the PNGs the run drew. Anything missing or garbled that is required is an ``InputError`` naming
the file; optional inputs that cannot be read become a note on the page instead.

Records of other backends may lack the simulator's extra columns: they are filled in
(``end_s = start_s + duration_s``, busy GPU-seconds = ``gpus x duration_s``, one group ``all``,
the plan's nodes for each job and phase when a plan is known, else the job's name as the row).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from weave_rl.planner.plan import Plan, load_plan
from weave_rl.profiles.jobs import JobSet, load_jobs
from weave_rl.profiles.records import read_records
from weave_rl.topology.topology import node_of
from weave_rl.core.errors import InputError


@dataclass
class RunData:
    folder: Path
    records: pd.DataFrame
    metrics: dict
    plan: Plan | None = None
    plan_source: str = ""
    jobs: JobSet | None = None
    jobs_source: str = ""
    gpu_types: dict | None = None
    pictures: dict[str, bytes] = field(default_factory=dict)  # file name -> PNG bytes
    notes: list[str] = field(default_factory=list)  # optional inputs that could not be read


def load_run(folder: Path, *, plan: Path | None = None, jobs: Path | None = None) -> RunData:
    folder = Path(folder)
    if not folder.exists():
        raise InputError(str(folder), None, "no such folder (expected the --out folder of weave simulate or run)")
    if not folder.is_dir():
        raise InputError(str(folder), None, "not a folder (expected the --out folder of weave simulate or run)")
    metrics = _metrics(folder / "metrics.json")
    records_file = folder / "records.parquet"
    if not records_file.exists():
        records_file = folder / "records.csv"
    if not records_file.exists():
        raise InputError(str(folder), None, "not a run folder: no records.parquet or records.csv")
    records = read_records(records_file)
    if records.empty:
        raise InputError(str(records_file), None, "no records: the run finished no phase")
    run = RunData(folder, records, metrics)
    inputs = metrics.get("inputs") if isinstance(metrics.get("inputs"), dict) else {}
    run.gpu_types = _gpu_types(inputs.get("topology"))
    run.plan, run.plan_source = _optional(run, "plan", plan, folder / "plan.yaml", inputs.get("plan"), load_plan)
    run.jobs, run.jobs_source = _optional(run, "jobs file", jobs, folder / "jobs.yaml", inputs.get("jobs"),
                                          lambda p: load_jobs(p, run.gpu_types) if run.gpu_types else load_jobs(p))
    run.records = complete(records, run.plan)
    for png in sorted(folder.glob("*.png"))[:13]:
        run.pictures[png.name] = png.read_bytes()
    return run


def _metrics(path: Path) -> dict:
    if not path.exists():
        raise InputError(str(path.parent), None, "not a run folder: no metrics.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), None, f"cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(str(path), None, f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise InputError(str(path), None, "expected a JSON object (the run's metrics)")
    for key in ("per_job", "clusters"):
        if key in data and not isinstance(data[key], dict):
            raise InputError(str(path), key, "expected a JSON object")
    for key in ("log", "replans", "drift_detections"):
        if key in data and not isinstance(data[key], list):
            raise InputError(str(path), key, "expected a JSON list")
    return data


def _optional(run: RunData, what: str, given: Path | None, beside: Path, named: object, load):
    """Load an optional input: the one given (its errors are the user's), else the first found."""
    if given is not None:
        return load(given), str(given)
    candidates = [beside]
    if isinstance(named, str) and named:
        p = Path(named)
        candidates += [p] if p.is_absolute() else [p, run.folder / p]
    for path in candidates:
        if path.is_file():
            try:
                return load(path), str(path)
            except InputError as exc:
                run.notes.append(f"{what} not used: {exc}")
                return None, ""
    if isinstance(named, str) and named:
        run.notes.append(f"{what} {named!r} (from metrics.json) not found from here or from {run.folder}")
    return None, ""


def _gpu_types(topology: object):
    """The GPU catalog of a preset topology (custom types of a topology file are not known here)."""
    if not isinstance(topology, str):
        return None
    try:
        from weave_rl.topology.presets import PRESETS
        from weave_rl.topology.topology import load_topology

        return dict(load_topology(topology).gpu_types) if topology in PRESETS else None
    except Exception:  # noqa: BLE001 - a catalog is a nicety; the builtin one is the fallback
        return None


def complete(records: pd.DataFrame, plan: Plan | None) -> pd.DataFrame:
    """The simulator's extra columns, filled in where a backend did not write them."""
    frame = records.copy()
    if "end_s" not in frame:
        frame["end_s"] = frame["start_s"] + frame["duration_s"]
    if "width_s" not in frame:
        frame["width_s"] = frame["duration_s"]
    if "busy_gpu_s" not in frame:
        frame["busy_gpu_s"] = (frame["phase"] != "sync") * frame["gpus"] * frame["duration_s"]
    if "switch_gpu_s" not in frame:
        frame["switch_gpu_s"] = (frame["phase"] != "sync") * frame["gpus"] * frame["switch_s"]
    if "group" not in frame:
        frame["group"] = _from_plan(frame, plan, lambda g, jp, slot: g.name, "all")
    if "nodes" not in frame:
        frame["nodes"] = _from_plan(frame, plan, lambda g, jp, slot: ",".join(sorted({node_of(x)
                                                                              for x in slot.gpus})), None)
        frame["nodes"] = frame["nodes"].fillna(frame["job"])
    if "cluster" not in frame:
        frame["cluster"] = frame["gpu_type"]  # a pool per GPU type when the run did not name clusters
    frame["nodes"] = frame["nodes"].fillna("").astype(str)
    frame["group"] = frame["group"].fillna("all").astype(str)
    frame["cluster"] = frame["cluster"].fillna("").astype(str)
    return frame


def _from_plan(frame: pd.DataFrame, plan: Plan | None, pick, default) -> pd.Series:
    if plan is None:
        return pd.Series([default] * len(frame), index=frame.index, dtype=object)
    jobs = plan.jobs
    values = []
    for job, phase in zip(frame["job"], frame["phase"]):
        entry = jobs.get(job)
        values.append(pick(entry[0], entry[1], entry[1].phase(phase)) if entry is not None else default)
    return pd.Series(values, index=frame.index, dtype=object)
