"""What a simulation run reports: the records table (DESIGN 3.4) and the metrics.

Definitions (``metrics``):

- ``iteration_s`` of a job: mean time per iteration from its first rollout start to its last
  sync end; ``steady_iteration_s``: mean gap between consecutive rollout starts over the second
  half of its iterations (what the plan's ``iteration_s`` predicts); ``slo_met``: ``iteration_s <=
  slo * solo_sampled_s``, the solo iteration of the same sampled (and drifted) phase durations moved
  to the job's solo GPUs, plus its solo sync and its share of the one cold start a solo run pays
  too (the first rollout's warm-up, which ``iteration_s`` counts from the first permit)
  (``solo_iteration_s`` is the profile's, at the median).
- ``$/h``: the price of the nodes of the groups that hold live jobs, as a step function of time;
  time-averaged over the run and its peak; GPUs held per cluster likewise.
- Per cluster: ``utilization`` = compute GPU-seconds / held GPU-seconds, ``switch_share`` = warm
  switch GPU-seconds / held, ``bubble_share`` = the rest (idle). A lent GPU's work counts in the
  cluster of the phase it helped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import mean

import pandas as pd

from weave_rl.executor.controller import Controller
from weave_rl.planner.model import PlanningModel
from weave_rl.profiles.records import records_frame, write_records


def records_table(controller: Controller) -> pd.DataFrame:
    return records_frame(controller.records, "<simulation>")


def held_stats(controller: Controller, end_s: float, start_s: float = 0.0) -> dict:
    """Time-averaged and peak $/h and GPUs held per cluster over ``[start_s, end_s]``."""
    timeline = controller.held_timeline
    span = max(end_s - start_s, 1e-9)
    cost_area = 0.0
    gpu_area: dict[str, float] = {}
    peak_cost = 0.0
    peak_gpus: dict[str, int] = {}
    for i, (t, usd, gpus) in enumerate(timeline):
        t_next = timeline[i + 1][0] if i + 1 < len(timeline) else end_s
        a, b = max(t, start_s), min(t_next, end_s)
        if b > a:
            cost_area += usd * (b - a)
            for c, n in gpus.items():
                gpu_area[c] = gpu_area.get(c, 0.0) + n * (b - a)
        if t_next > start_s and t <= end_s:
            peak_cost = max(peak_cost, usd)
            for c, n in gpus.items():
                peak_gpus[c] = max(peak_gpus.get(c, 0), n)
    return {"avg_usd_per_hour": cost_area / span, "peak_usd_per_hour": peak_cost, "peak_gpus": peak_gpus,
            "held_gpu_s": gpu_area, "usd": cost_area / 3600.0}


def job_metrics(controller: Controller) -> dict[str, dict]:
    model = PlanningModel(controller.topology, controller.jobs, 0.5)
    work = _sampled_work(controller)
    out = {}
    for name, st in controller.state.items():
        n = st.done["sync"] + 1
        if n <= 0 or st.first_start is None:
            continue
        last = st.iteration_ends.get(st.done["sync"], controller.now)
        starts = [st.rollout_starts[k] for k in sorted(st.rollout_starts)]
        half = len(starts) // 2
        steady = (starts[-1] - starts[half]) / (len(starts) - 1 - half) if len(starts) - 1 > half else math.nan
        spec = controller.specs[name]
        solo = model.solo_iteration_s(spec)
        rollout_gpus, train_gpus = model.solo_placement(spec)
        sampled = work.get(name)
        # A solo run pays the same one cold start (its first rollout's warm-up, counted in
        # ``iteration`` from the permit on) once over its n iterations.
        cold = model.max_switch_s(spec, "rollout", rollout_gpus) / n
        solo_sampled = (sampled + model.sync_s(spec, train_gpus, rollout_gpus) + cold) if sampled is not None else solo
        entry = controller.job_plans.get(name)
        planned = entry[1].iteration_s if entry else math.nan
        iteration = (last - st.first_start) / n
        out[name] = {"iterations": n, "iteration_s": iteration, "steady_iteration_s": steady,
                     "planned_iteration_s": planned, "solo_iteration_s": solo, "solo_sampled_s": solo_sampled,
                     "slo": spec.slo, "slo_met": iteration <= spec.slo * solo_sampled * (1 + 1e-9),
                     "restarts": st.restarts, "first_start_s": st.first_start, "end_s": last}
    return out


def _sampled_work(controller: Controller) -> dict[str, float]:
    """Per job: mean over its iterations of rollout + train as drawn, moved to its solo GPUs.

    This is the solo iteration the job would have had with the same sampled (and drifted)
    durations; SLO attainment compares against it, so noise and drift that would slow the job
    down when alone too do not count as the schedule's fault.
    """
    sums: dict[str, float] = {}
    iters: dict[str, set[int]] = {}
    factors: dict[tuple, float] = {}
    catalog = controller.topology.gpu_types
    for r in controller.records:
        # A resumed run's controller holds only the jobs left; the records of one that finished
        # before the resume stay in the records, not in its metrics.
        if r["phase"] == "sync" or r["job"] not in controller.specs:
            continue
        key = (r["job"], r["phase"], r["gpus"], r["gpu_type"])
        f = factors.get(key)
        if f is None:
            phase = controller.specs[r["job"]].phase(r["phase"])
            f = factors[key] = phase.duration_at(0.5, catalog=catalog) / phase.duration_at(0.5, r["gpus"], r["gpu_type"],
                                                                                          catalog)
        sums[r["job"]] = sums.get(r["job"], 0.0) + r["width_s"] * f
        iters.setdefault(r["job"], set()).add(r["iteration"])
    # A restarted iteration's rows count once per attempt: average over attempts, not iterations.
    counts: dict[str, int] = {}
    for r in controller.records:
        if r["phase"] == "rollout":
            counts[r["job"]] = counts.get(r["job"], 0) + 1
    return {j: sums[j] / max(1, counts.get(j, len(iters[j]))) for j in sums}


def cluster_metrics(controller: Controller, held_gpu_s: dict[str, float]) -> dict[str, dict]:
    busy: dict[str, float] = {}
    switch: dict[str, float] = {}
    for r in controller.records:
        if r["phase"] == "sync":
            continue
        busy[r["cluster"]] = busy.get(r["cluster"], 0.0) + r["busy_gpu_s"]
        switch[r["cluster"]] = switch.get(r["cluster"], 0.0) + r["switch_gpu_s"]
    out = {}
    for c, held in held_gpu_s.items():
        if held <= 0:
            continue
        u = busy.get(c, 0.0) / held
        s = switch.get(c, 0.0) / held
        out[c] = {"held_gpu_s": held, "utilization": u, "switch_share": s, "bubble_share": max(0.0, 1 - u - s)}
    return out


def metrics(controller: Controller, *, wall_s: float, events: int, plan_iteration: bool = True,
            start_s: float = 0.0) -> dict:
    end = controller.now
    held = held_stats(controller, end, start_s)
    jobs = job_metrics(controller)
    attained = [j["slo_met"] for j in jobs.values()]
    devs = [abs(j["steady_iteration_s"] / j["planned_iteration_s"] - 1) for j in jobs.values()
            if plan_iteration and not math.isnan(j["steady_iteration_s"]) and not math.isnan(j["planned_iteration_s"])]
    return {
        "horizon_s": end,
        "jobs": len(jobs),
        "iterations": sum(j["iterations"] for j in jobs.values()),
        "avg_usd_per_hour": held["avg_usd_per_hour"],
        "peak_usd_per_hour": held["peak_usd_per_hour"],
        "usd": held["usd"],
        "peak_gpus": held["peak_gpus"],
        "slo_attainment": mean(attained) if attained else math.nan,
        "max_plan_deviation": max(devs) if devs else math.nan,
        "clusters": cluster_metrics(controller, held["held_gpu_s"]),
        "restarts": sum(j["restarts"] for j in jobs.values()),
        "elastic_actions": dict(controller.elastic_counts),
        "events": events,
        "wall_s": wall_s,
        "events_per_s": events / wall_s if wall_s > 0 else math.nan,
        "per_job": jobs,
        "log": controller.events,
    }


def write_outputs(out: Path, controller: Controller, data: dict) -> list[Path]:
    """records.parquet, records.csv and metrics.json under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    frame = records_table(controller)
    paths = [out / "records.parquet", out / "records.csv", out / "metrics.json"]
    write_records(frame, paths[0])
    write_records(frame, paths[1])
    paths[2].write_text(json.dumps(json_safe(data), indent=2, default=str))
    return paths


def json_safe(value):
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
