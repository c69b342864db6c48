"""The report's tables: rows of plain values computed from a run (rendered by ``weave_rl.executor.report.page``)."""

from __future__ import annotations

import math

import pandas as pd

from weave_rl.executor.report.figures import slo_bound
from weave_rl.executor.report.load import RunData
from weave_rl.profiles.fit import fit_jobs
from weave_rl.profiles.jobs import JobSet
from weave_rl.core.errors import InputError

Table = tuple[list[str], list[list]]


def jobs_table(per_job: dict[str, dict], times: dict[str, list[tuple[int, float]]]) -> Table:
    cols = ["job", "iterations", "planned s", "steady s", "mean s", "worst s", "SLO bound s", "SLO met", "restarts"]
    rows = []
    for job, j in sorted(per_job.items()):
        worst = max((t for _, t in times.get(job, [])), default=math.nan)
        met = j.get("slo_met")
        rows.append([job, j.get("iterations"), j.get("planned_iteration_s"), j.get("steady_iteration_s"),
                     j.get("iteration_s"), worst, slo_bound(j), "-" if met is None else ("yes" if met else "NO"),
                     j.get("restarts")])
    return cols, rows


def node_bubbles(frame: pd.DataFrame, horizon_s: float) -> Table:
    """Per node: share of the run with no phase (or switch) on it, and its longest such gap."""
    cols = ["node", "pool", "phases", "busy %", "bubble %", "longest bubble s", "at t s"]
    rows = []
    gpu = frame[frame["phase"] != "sync"]
    spans: dict[str, list[tuple[float, float]]] = {}
    pool: dict[str, str] = {}
    for r in gpu.itertuples(index=False):
        for node in str(r.nodes).split(","):
            if node:
                spans.setdefault(node, []).append((float(r.start_s) - float(r.switch_s), float(r.end_s)))
                pool.setdefault(node, str(r.cluster))
    horizon = max(horizon_s, float(frame["end_s"].max()))
    for node in sorted(spans):
        merged: list[list[float]] = []
        for a, b in sorted(spans[node]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        covered = sum(b - a for a, b in merged)
        # Gaps between phases, and before the first / after the last inside [0, horizon].
        edges = [0.0] + [x for ab in merged for x in ab] + [horizon]
        gaps = [(edges[i + 1] - edges[i], edges[i]) for i in range(0, len(edges) - 1, 2)]
        longest, at = max(gaps) if gaps else (0.0, 0.0)
        share = covered / horizon if horizon > 0 else math.nan
        rows.append([node, pool[node], len(spans[node]), 100 * share, 100 * (1 - share), longest, at])
    return cols, rows


def replans_table(metrics: dict) -> Table:
    cols = ["t s", "job", "reason", "$/h before", "$/h after", "moved"]
    rows = [[r.get("t"), r.get("job"), r.get("reason"), r.get("usd_per_hour_before"), r.get("usd_per_hour_after"),
             ", ".join(r.get("moved") or []) or "none"] for r in metrics.get("replans", []) if isinstance(r, dict)]
    return cols, rows


def events_table(metrics: dict, limit: int = 200) -> Table:
    """Plan switches, admissions, restarts and node faults from the controller's log."""
    cols = ["t s", "event", "who", "reason / detail", "$/h after"]
    rows = []
    for e in metrics.get("log", [])[:limit]:
        if not isinstance(e, dict):
            continue
        who = e.get("job") or e.get("node") or ", ".join(e.get("jobs") or [])
        detail = e.get("reason", "")
        if e.get("event") == "restart":
            detail = f"{detail}; from iteration {e.get('iteration')}, {e.get('rollouts_discarded', 0)} rollouts redone"
        rows.append([e.get("t"), e.get("event"), who, detail, e.get("usd_per_hour")])
    return cols, rows


def profile_fits(run: RunData) -> tuple[Table | None, str]:
    """Profiled vs refitted durations per job and phase, at the fitted reference point."""
    if run.jobs is None:
        return None, "no jobs file found (give --jobs, or keep jobs.yaml in the run folder)"
    known = set(run.jobs.names)
    frame = run.records[run.records["phase"].isin(["rollout", "train"]) & run.records["job"].isin(known)].copy()
    if frame.empty:
        return None, "no rollout or train records of the jobs in " + run.jobs_source
    # Durations on the planned GPUs (elastic runs change the GPU count midway), as drift refits do.
    frame["duration_s"] = frame["width_s"]
    jobs = JobSet(jobs=[j for j in run.jobs.jobs if j.name in set(frame["job"])])
    kwargs = {"gpu_types": run.gpu_types} if run.gpu_types else {}
    try:
        fitted = fit_jobs(frame, jobs, records_file="records", **kwargs)
    except InputError as exc:
        return None, f"profile fit failed: {exc}"
    cols = ["job", "phase", "at", "samples", "profile p50 s", "measured p50 s", "ratio p50", "profile p95 s",
            "measured p95 s"]
    rows = []
    for spec in jobs.jobs:
        new = fitted[spec.name]
        for phase in ("rollout", "train"):
            n = int(((frame["job"] == spec.name) & (frame["phase"] == phase)).sum())
            if not n:
                continue
            f, p = new.phase(phase), spec.phase(phase)
            at = (f.gpus, f.gpu_type)
            catalog = {"catalog": run.gpu_types} if run.gpu_types else {}
            p50, p95 = p.duration_at(0.5, *at, **catalog), p.duration_at(0.95, *at, **catalog)
            m50, m95 = f.duration_s.quantile(0.5), f.duration_s.quantile(0.95)
            rows.append([spec.name, phase, f"{f.gpus} x {f.gpu_type}", n, p50, m50, m50 / p50 if p50 else math.nan,
                         p95, m95])
    return (cols, rows), f"jobs file: {run.jobs_source}"


def detections_table(metrics: dict) -> Table:
    cols = ["t s", "job", "phase", "EWMA of measured / profile"]
    rows = [[d.get("t"), d.get("job"), d.get("phase"), d.get("ewma")] for d in metrics.get("drift_detections", [])
            if isinstance(d, dict)]
    return cols, rows
