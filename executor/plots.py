"""Pictures of a simulated run: a Gantt PNG and a plotly HTML timeline per group, and utilization.

The timeline draws what ran, from the records: one row per node, one bar per phase on each node
its planned GPUs sit on (rollout light, train full colour, as in ``weave_rl.planner.gantt``), warm switches
as thin grey bars before the phase, syncs as a hatched strip on the receivers' rows. Failures and
plan switches are vertical lines. A PNG shows at most ``window`` seconds (from the middle of the
run, where the steady state is); the HTML shows the whole run up to ``MAX_BARS`` bars per group.
Utilization over time bins each record's compute GPU-seconds evenly over its span.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from weave_rl.planner.gantt import PALETTE, phase_colour, tint

MAX_GROUPS = 12
MAX_BARS = 4000


def _colours(frame: pd.DataFrame) -> dict[str, str]:
    names = list(dict.fromkeys(frame["job"]))
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def _bars(frame: pd.DataFrame) -> list[dict]:
    out = []
    for r in frame.itertuples(index=False):
        for node in str(r.nodes).split(","):
            if node:
                out.append({"node": node, "job": r.job, "phase": r.phase, "iteration": int(r.iteration),
                            "start": float(r.start_s), "end": float(r.end_s), "switch": float(r.switch_s),
                            "gpus": int(r.gpus)})
    return out


def group_frames(frame: pd.DataFrame, max_groups: int = MAX_GROUPS) -> list[tuple[str, pd.DataFrame]]:
    groups = list(dict.fromkeys(frame["group"]))[:max_groups]
    return [(g, frame[frame["group"] == g]) for g in groups]


def gantt_png(frame: pd.DataFrame, group: str, path: Path, *, window: float | None = None,
              marks: list[tuple[float, str]] = ()) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    colours = _colours(frame)
    t0, t1 = float(frame["start_s"].min()), float(frame["end_s"].max())
    if window is not None and t1 - t0 > window:
        mid = (t0 + t1) / 2
        t0, t1 = mid - window / 2, mid + window / 2
    bars = [b for b in _bars(frame) if b["end"] >= t0 and b["start"] <= t1]
    rows = sorted({b["node"] for b in bars})
    y = {n: i for i, n in enumerate(rows)}
    fig = Figure(figsize=(15, 1.2 + 0.45 * max(1, len(rows))), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_facecolor("#eeeeee")
    for b in bars:
        yc = y[b["node"]]
        base = colours[b["job"]]
        if b["phase"] == "sync":
            ax.barh(yc + 0.33, b["end"] - b["start"], left=b["start"], height=0.14, color="white",
                    edgecolor=base, hatch="////", lw=0.6)
            continue
        if b["switch"] > 0:
            ax.barh(yc, b["switch"], left=b["start"] - b["switch"], height=0.6, color="#999999", lw=0)
        ax.barh(yc, b["end"] - b["start"], left=b["start"], height=0.6, color=phase_colour(base, b["phase"]),
                edgecolor=tint(base, -0.35), lw=0.6)
    for t, label in marks:
        if t0 <= t <= t1:
            ax.axvline(t, color="#d62728", lw=1.2, ls="--")
            ax.text(t, -0.6, label, fontsize=7, color="#d62728", rotation=0, va="bottom")
    ax.set_xlim(t0, t1)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.7)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(f"group {group}: simulated timeline (rollout light, train full, grey = warm switch, "
                 f"hatched = sync)".replace("$", r"\$"), fontsize=10, loc="left")
    handles = [Patch(facecolor=c, label=j) for j, c in colours.items()][:20]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def timeline_html(frame: pd.DataFrame, group: str, path: Path, *, marks: list[tuple[float, str]] = ()) -> Path:
    import plotly.graph_objects as go

    colours = _colours(frame)
    bars = _bars(frame)[:MAX_BARS]
    rows = sorted({b["node"] for b in bars})
    y = {n: i for i, n in enumerate(rows)}
    fig = go.Figure()
    by_key: dict[tuple[str, str], list[dict]] = {}
    for b in bars:
        by_key.setdefault((b["job"], b["phase"]), []).append(b)
    shown: set[str] = set()
    for (job, phase), bs in by_key.items():
        base = colours[job]
        sync = phase == "sync"
        fig.add_trace(go.Bar(
            orientation="h", base=[b["start"] for b in bs], x=[b["end"] - b["start"] for b in bs],
            y=[y[b["node"]] + (0.33 if sync else 0.0) for b in bs], width=0.14 if sync else 0.6,
            name=job, legendgroup=job, showlegend=job not in shown,
            marker=dict(color="white" if sync else phase_colour(base, phase), line=dict(color=base, width=1),
                        pattern=dict(shape="/" if sync else "")),
            customdata=[f"<b>{job}</b> {phase} #{b['iteration']}<br>{b['start']:.2f} .. {b['end']:.2f} s "
                        f"({b['end'] - b['start']:.2f} s), switch {b['switch']:.2f} s, {b['gpus']} GPUs"
                        for b in bs],
            hovertemplate="%{customdata}<extra></extra>"))
        shown.add(job)
    for t, label in marks:
        fig.add_vline(x=t, line=dict(color="#d62728", dash="dash"), annotation_text=label)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))), ticktext=rows,
                     range=[len(rows) - 0.4, -0.7])
    fig.update_layout(title=f"group {group}: simulated timeline", barmode="overlay", plot_bgcolor="#eeeeee",
                      xaxis_title="simulated time (s)", height=220 + 40 * len(rows))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def utilization_series(frame: pd.DataFrame, held: list[tuple[float, float, dict[str, int]]], end_s: float,
                       bins: int = 200) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Bin edges, busy GPUs per cluster per bin, and GPUs held per cluster per bin."""
    edges = np.linspace(0.0, max(end_s, 1e-9), bins + 1)
    width = edges[1] - edges[0]
    gpu = frame[frame["phase"] != "sync"]
    busy: dict[str, np.ndarray] = {}
    for cluster, part in gpu.groupby("cluster"):
        acc = np.zeros(bins)
        for s, e, w in zip(part["start_s"], part["end_s"], part["busy_gpu_s"]):
            if e <= s:
                continue
            rate = w / (e - s)  # GPUs busy on average during the phase
            i0, i1 = int(s // width), min(bins - 1, int(e // width))
            for i in range(i0, i1 + 1):
                overlap = min(e, edges[i + 1]) - max(s, edges[i])
                if overlap > 0:
                    acc[i] += rate * overlap / width
        busy[str(cluster)] = acc
    held_arr: dict[str, np.ndarray] = {}
    centers = (edges[:-1] + edges[1:]) / 2
    times = [h[0] for h in held]
    for c in {c for _, _, g in held for c in g} | set(busy):
        arr = np.zeros(bins)
        for i, t in enumerate(centers):
            j = int(np.searchsorted(times, t, side="right")) - 1
            arr[i] = held[j][2].get(c, 0) if j >= 0 else 0
        held_arr[c] = arr
    return edges, busy, held_arr


def utilization_png(frame: pd.DataFrame, held: list, end_s: float, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    edges, busy, held_arr = utilization_series(frame, held, end_s)
    centers = (edges[:-1] + edges[1:]) / 2
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, c in enumerate(sorted(held_arr)):
        colour = PALETTE[i % len(PALETTE)]
        ax.plot(centers, held_arr[c], color=colour, lw=1.0, ls="--", label=f"{c}: GPUs held")
        ax.plot(centers, busy.get(c, np.zeros_like(centers)), color=colour, lw=1.5, label=f"{c}: GPUs computing")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GPUs")
    ax.set_title("GPUs held and computing per cluster (gap = switches and bubbles)", loc="left", fontsize=10)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def draw_all(out: Path, frame: pd.DataFrame, held: list, end_s: float, *, cycle_hint: float | None = None,
             marks: list[tuple[float, str]] = (), max_groups: int = MAX_GROUPS) -> list[Path]:
    paths = []
    window = 6 * cycle_hint if cycle_hint else None
    for group, part in group_frames(frame, max_groups):
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in str(group))
        paths.append(gantt_png(part, group, out / f"gantt-{safe}.png", window=window, marks=marks))
        paths.append(timeline_html(part, group, out / f"timeline-{safe}.html", marks=marks))
    paths.append(utilization_png(frame, held, end_s, out / "utilization.png"))
    return paths
