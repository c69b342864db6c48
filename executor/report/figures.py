"""The report's plotly figures, built in memory from a run's records, metrics and plan.

- ``gantt_figure``: per group, the plan's timetable over ``cycles`` cycles (top) above the measured
  timeline over as many cycles (bottom), same node rows, same x range. The measured window starts
  where the plan's would: at the rollout of the group's first job in the middle iteration of the
  run, minus that rollout's offset in the cycle (so a run that keeps to the plan lines up bar for
  bar). Drawing as in ``weave_rl.planner.gantt``: rollout light, train full colour, sync a hatched strip under
  the receivers' row, warm switches grey.
- ``pools_figure``: per cluster, the held GPU-seconds split into compute / switch / bubble (metrics.json).
- ``busy_figure``: GPUs computing over time per cluster (from the records), with the peak GPUs held.
- ``iterations_figure``: per job, each iteration's time over its SLO bound (``slo x solo_sampled_s``):
  points above 1.0 miss the SLO. Iteration k's time is the gap between the ends of syncs k-1 and k
  (iteration 0: from the first rollout start), so restarts and replans show as spikes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from weave_rl.executor.plots import utilization_series
from weave_rl.planner.gantt import PALETTE, group_rows, phase_colour, phase_segments, tint
from weave_rl.planner.plan import GroupPlan, Plan

SWITCH_COLOUR = "#999999"
IDLE = "#eeeeee"
MAX_BARS = 3000  # per panel, so that a long run's page stays light


def colours(plan: Plan | None, frame: pd.DataFrame) -> dict[str, str]:
    names = [j.name for g in plan.groups for j in g.jobs] if plan is not None else []
    names += [j for j in dict.fromkeys(frame["job"]) if j not in names]
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def window_start(frame: pd.DataFrame, group: GroupPlan) -> float:
    """Where the measured window of ``group`` starts (see module doc)."""
    first = group.jobs[0]
    rolls = frame[(frame["job"] == first.name) & (frame["phase"] == "rollout")]
    if rolls.empty:
        return float(frame["start_s"].min()) if len(frame) else 0.0
    mid = int(rolls["iteration"].max()) // 2
    at = rolls[rolls["iteration"] == mid].sort_values("start_s")
    start = float(at["start_s"].iloc[-1]) if len(at) else float(rolls["start_s"].min())
    return max(0.0, start - first.phase("rollout").start_s % group.cycle_s)


def _measured_bars(frame: pd.DataFrame, t0: float, t1: float) -> list[dict]:
    part = frame[(frame["end_s"] >= t0) & (frame["start_s"] - frame["switch_s"] <= t1)]
    bars = []
    for r in part.itertuples(index=False):
        for node in str(r.nodes).split(","):
            if node:
                bars.append({"row": node, "job": r.job, "phase": r.phase, "start": float(r.start_s) - t0,
                             "end": float(r.end_s) - t0, "switch": float(r.switch_s),
                             "hover": f"<b>{r.job}</b> {r.phase} #{int(r.iteration)}<br>t = {r.start_s:.1f} .. "
                                      f"{r.end_s:.1f} s ({r.duration_s:.2f} s), switch {r.switch_s:.2f} s, "
                                      f"{int(r.gpus)} GPUs"})
    return bars[:MAX_BARS]


def _planned_bars(plan: Plan, group: GroupPlan, cycles: int) -> list[dict]:
    one = plan.model_copy(update={"groups": [group]})
    return [{"row": s.row, "job": s.job, "phase": s.phase, "start": s.start, "end": s.end, "switch": 0.0,
             "hover": f"<b>{s.job}</b> {s.phase}: offset {s.phase_start:.1f} s in the cycle, "
                      f"{s.phase_duration:.2f} s planned"}
            for s in phase_segments(one, cycles, "node")]


def _add_bars(fig: go.Figure, bars: list[dict], rows: dict[str, int], palette: dict[str, str], row: int,
              shown: set[str]) -> None:
    by_key: dict[tuple[str, str], list[dict]] = {}
    for b in bars:
        by_key.setdefault((b["job"], b["phase"]), []).append(b)
    switches = [b for b in bars if b["switch"] > 0 and b["phase"] != "sync"]
    if switches:
        fig.add_trace(go.Bar(orientation="h", base=[b["start"] - b["switch"] for b in switches],
                             x=[b["switch"] for b in switches], y=[rows[b["row"]] for b in switches], width=0.6,
                             name="warm switch", legendgroup="switch", showlegend="switch" not in shown,
                             marker=dict(color=SWITCH_COLOUR), hoverinfo="skip"), row=row, col=1)
        shown.add("switch")
    for (job, phase), bs in by_key.items():
        base = palette.get(job, "#333333")
        sync = phase == "sync"
        fig.add_trace(go.Bar(
            orientation="h", base=[b["start"] for b in bs], x=[max(b["end"] - b["start"], 1e-3) for b in bs],
            y=[rows[b["row"]] + (0.33 if sync else 0.0) for b in bs], width=0.14 if sync else 0.6,
            name=job, legendgroup=job, showlegend=job not in shown, customdata=[b["hover"] for b in bs],
            hovertemplate="%{customdata}<extra></extra>",
            marker=dict(color="white" if sync else phase_colour(base, phase),
                        line=dict(color=tint(base, -0.35) if not sync else base, width=1),
                        pattern=dict(shape="/" if sync else "", fgcolor=base))), row=row, col=1)
        shown.add(job)


def gantt_figure(frame: pd.DataFrame, plan: Plan | None, group: GroupPlan | None, name: str,
                 cycles: int = 3, span_s: float | None = None) -> go.Figure:
    """Planned above measured for one group; measured only (over ``span_s``) when there is no plan."""
    part = frame[frame["group"] == name]
    palette = colours(plan, frame)
    if group is not None and plan is not None:
        span = cycles * group.cycle_s
        t0 = window_start(part, group)
        planned = _planned_bars(plan, group, cycles)
        rows = group_rows(group, "node")
    else:
        span = span_s or float(part["end_s"].max() - part["start_s"].min())
        t0 = max(0.0, float(part["start_s"].min() + part["end_s"].max()) / 2 - span / 2)
        planned, rows = [], []
    measured = _measured_bars(part, t0, t0 + span)
    rows += sorted({b["row"] for b in measured} - set(rows))
    index = {r: i for i, r in enumerate(rows)}
    panels = 2 if planned else 1
    titles = ([f"planned: group {name}, cycle {group.cycle_s:.1f} s, {cycles} cycles"] if planned else []) + \
        [f"measured: t = {t0:,.1f} .. {t0 + span:,.1f} s of the run (shifted to 0)"]
    fig = make_subplots(rows=panels, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=titles)
    shown: set[str] = set()
    if planned:
        _add_bars(fig, planned, index, palette, 1, shown)
    _add_bars(fig, measured, index, palette, panels, shown)
    for r in range(1, panels + 1):
        fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))), ticktext=rows,
                         range=[len(rows) - 0.4, -0.7], row=r, col=1)
        fig.update_xaxes(range=[0, span], row=r, col=1)
        if group is not None:
            for k in range(1, cycles):
                fig.add_vline(x=k * group.cycle_s, line=dict(color="#555555", width=1, dash="dash"), row=r, col=1)
    fig.update_xaxes(title_text="seconds from the window start", row=panels, col=1)
    fig.update_layout(barmode="overlay", plot_bgcolor=IDLE, height=140 + panels * (70 + 38 * len(rows)),
                      margin=dict(t=60, l=10, r=10, b=40), legend=dict(title="jobs"))
    return fig


def pools_figure(clusters: dict[str, dict]) -> go.Figure:
    names = sorted(clusters)
    fig = go.Figure()
    for key, label, colour in (("utilization", "computing", "#2ca02c"), ("switch_share", "warm switch", SWITCH_COLOUR),
                               ("bubble_share", "bubble (idle)", "#d62728")):
        values = [100 * float(clusters[c].get(key) or 0.0) for c in names]
        fig.add_trace(go.Bar(orientation="h", y=names, x=values, name=label, marker=dict(color=colour),
                             text=[f"{v:.1f}%" for v in values], textposition="inside",
                             hovertemplate="%{y}: %{x:.1f}% of held GPU-seconds<extra>" + label + "</extra>"))
    fig.update_layout(barmode="stack", height=120 + 50 * len(names), xaxis=dict(title="% of held GPU-seconds",
                      range=[0, 100]), margin=dict(t=30, l=10, r=10, b=40))
    return fig


def busy_figure(frame: pd.DataFrame, end_s: float, peak_gpus: dict[str, int]) -> go.Figure:
    edges, busy, _ = utilization_series(frame, [], end_s)
    centers = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure()
    for i, cluster in enumerate(sorted(set(busy) | set(peak_gpus))):
        colour = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(x=centers, y=busy.get(cluster, np.zeros_like(centers)), mode="lines",
                                 name=f"{cluster}: GPUs computing", line=dict(color=colour)))
        if cluster in peak_gpus:
            fig.add_trace(go.Scatter(x=[0, end_s], y=[peak_gpus[cluster]] * 2, mode="lines",
                                     name=f"{cluster}: peak GPUs held", line=dict(color=colour, dash="dash")))
    fig.update_layout(height=360, xaxis_title="time (s)", yaxis_title="GPUs", margin=dict(t=30, l=10, r=10, b=40))
    return fig


def iteration_times(frame: pd.DataFrame) -> dict[str, list[tuple[int, float]]]:
    """Per job: (iteration, seconds) from sync end to sync end (see module doc); last attempt counts."""
    out: dict[str, list[tuple[int, float]]] = {}
    for job, part in frame.groupby("job", sort=False):
        syncs = part[part["phase"] == "sync"].groupby("iteration")["end_s"].max().sort_index()
        rolls = part[part["phase"] == "rollout"]
        if syncs.empty or rolls.empty:
            continue
        prev = float(rolls["start_s"].min())
        times = []
        for k, end in syncs.items():
            times.append((int(k), float(end) - prev))
            prev = float(end)
        out[str(job)] = times
    return out


def slo_bound(entry: dict) -> float:
    """``slo x solo_sampled_s`` of a metrics.json per-job entry (NaN when unknown)."""
    try:
        return float(entry["slo"]) * float(entry.get("solo_sampled_s") or entry["solo_iteration_s"])
    except (KeyError, TypeError, ValueError):
        return math.nan


def iterations_figure(times: dict[str, list[tuple[int, float]]], per_job: dict[str, dict],
                      palette: dict[str, str]) -> go.Figure:
    fig = go.Figure()
    for job, series in times.items():
        bound = slo_bound(per_job.get(job, {}))
        if not math.isfinite(bound) or bound <= 0:
            continue
        fig.add_trace(go.Scatter(x=[k for k, _ in series], y=[t / bound for _, t in series], mode="lines+markers",
                                 name=job, line=dict(color=palette.get(job)),
                                 customdata=[t for _, t in series],
                                 hovertemplate=f"<b>{job}</b> iteration %{{x}}: %{{customdata:.1f}} s "
                                               f"(SLO bound {bound:.1f} s)<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#d62728", dash="dash"), annotation_text="SLO")
    fig.update_layout(height=380, xaxis_title="iteration", yaxis_title="iteration time / SLO bound",
                      margin=dict(t=30, l=10, r=10, b=40), legend=dict(title="jobs"))
    return fig
