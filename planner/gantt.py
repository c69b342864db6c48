"""Plan pictures: a Gantt chart of each group's timetable, as a PNG (matplotlib) or an HTML page (plotly).

Both renderers draw the same thing, computed once by :func:`phase_segments`:

- One panel per group, time in seconds on the x axis over ``cycles`` consecutive cycles of that
  group (``0 .. cycles * cycle_s``), one row per node (``by="node"``) or per GPU (``by="gpu"``).
- The timeline is the *steady state*: at every instant ``t`` it shows what the timetable runs at
  ``t mod cycle_s``. A phase that wraps past the end of the cycle therefore appears as two pieces in
  every cycle: its head ``[k*C + start, (k+1)*C)`` and its tail ``[k*C, k*C + start + duration - C)``
  (the tail of the iteration that began in the previous cycle). So the tail is drawn at time 0 of the
  first cycle too, and nothing is drawn past ``cycles * C``. Example, ``C = 100``, a phase at 90 for
  30 s: cycle 0 gives ``[90, 100)`` and ``[0, 20)``, cycle 1 gives ``[190, 200)`` and ``[100, 120)``.
- ``rollout`` and ``train`` hold GPU time: a bar on each row whose GPUs they use (by node: one bar on
  the node's row, whatever share of its GPUs the phase takes). Rollout is a light tint of the job's
  colour, train the full colour, so a job reads as one hue.
- ``sync`` holds no GPU time: it is a thin hatched strip with a marker just under the rows of the
  receiving GPUs, never in the bar band.
- Idle time is left as the light grey background, so bubbles show as grey gaps.
- Where two GPU phases share a node row at the same time (two jobs on different GPUs of one node,
  ``by="node"``), the row is split into lanes, assigned per (job, phase) so that they stay put from
  cycle to cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

from weave_rl.planner.plan import GroupPlan, Plan

By = Literal["node", "gpu"]
GPU_PHASES = ("rollout", "train")
PHASE_ORDER = {"rollout": 0, "train": 1, "sync": 2}
SHORT = {"rollout": "roll", "train": "train", "sync": "sync"}
MAX_GROUPS = 12
MAX_ROWS = 64  # rows drawn per group; the rest are counted in the panel title

# Geometry of a row (row i is centred on y = i, y grows downwards): the bar band for GPU phases and,
# under it, the thin strip for sync.
BAR_TOP, BAR_BOTTOM = -0.40, 0.22
SYNC_TOP, SYNC_BOTTOM = 0.27, 0.43

IDLE_COLOUR = "#eeeeee"
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
    "#e6550d", "#31a354", "#756bb1", "#636363",
)  # fmt: skip


@dataclass(frozen=True)
class Segment:
    """One drawn piece of a phase on one row.

    ``start``/``end`` are seconds on the group's continuous timeline ``[0, cycles * cycle_s]``;
    ``cycle`` is the cycle window the piece lies in; ``wrapped`` marks the tail of a phase that began
    in the previous cycle; ``phase_start``/``phase_duration`` are the phase's offset in its cycle and
    its full duration; ``gpus`` are the phase's GPUs on this row.
    """

    group: str
    row: str
    job: str
    phase: str
    start: float
    end: float
    gpus: tuple[str, ...] = ()
    cycle: int = 0
    wrapped: bool = False
    phase_start: float = 0.0
    phase_duration: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start


# ----------------------------------------------------------------------------------------------
# Geometry shared by both renderers


def node_of(gpu: str) -> str:
    node, sep, _ = gpu.rpartition(":")
    return node if sep else gpu


def _gpu_key(gpu: str, node_rank: dict[str, int]) -> tuple:
    node, sep, index = gpu.rpartition(":")
    if not sep:
        node, index = gpu, ""
    rank = node_rank.get(node, len(node_rank))
    return (rank, node, (0, int(index), "") if index.isdigit() else (1, 0, index))


def group_rows(group: GroupPlan, by: By = "node") -> list[str]:
    """Row labels of a group, in drawing order.

    By node: the group's nodes in plan order, then any node a phase uses that the group does not list.
    By GPU: every GPU a phase names, ordered by node (plan order) and numeric index; a listed node
    that no phase names gets a row of its own (under its node name), so a wholly idle node shows.
    """
    _check_by(by)
    node_rank = {n: i for i, n in enumerate(group.nodes)}
    used = [g for job in group.jobs for slot in job.phases for g in slot.gpus]
    if by == "node":
        extra = sorted({node_of(g) for g in used} - set(group.nodes))
        return list(group.nodes) + extra
    named = set(used)
    named_nodes = {node_of(g) for g in named}
    keys = named | {n for n in group.nodes if n not in named_nodes}
    return sorted(keys, key=lambda g: _gpu_key(g, node_rank))


def _modulo_pieces(start: float, duration: float, cycle: float) -> list[tuple[float, float, bool]]:
    """``[start, start + duration)`` folded onto ``[0, cycle)``: (begin, end, is_wrapped_tail)."""
    start = start % cycle
    if duration >= cycle:
        return [(0.0, cycle, False)]
    end = start + duration
    if end <= cycle:
        return [(start, end, False)]
    return [(start, cycle, False), (0.0, end - cycle, True)]


def phase_segments(plan: Plan, cycles: int = 2, by: By = "node") -> list[Segment]:
    """Every drawn piece of every phase of every group, over ``cycles`` cycles (see module doc).

    Order: group, job (plan order), phase (as listed), row, cycle, head before wrapped tail.
    Zero-length rollout/train phases are dropped; a zero-length sync is kept (drawn as a marker).
    """
    _check_by(by)
    if cycles < 1:
        raise ValueError(f"cycles must be at least 1, got {cycles}")
    out: list[Segment] = []
    for group in plan.groups:
        c = group.cycle_s
        order = {r: i for i, r in enumerate(group_rows(group, by))}
        for job in group.jobs:
            for slot in job.phases:
                if slot.duration_s <= 0 and slot.phase in GPU_PHASES:
                    continue
                by_row: dict[str, list[str]] = {}
                for gpu in slot.gpus:
                    by_row.setdefault(node_of(gpu) if by == "node" else gpu, []).append(gpu)
                pieces = _modulo_pieces(slot.start_s, slot.duration_s, c)
                for row in sorted(by_row, key=lambda r: order.get(r, len(order))):
                    for k in range(cycles):
                        for begin, end, wrapped in pieces:
                            out.append(
                                Segment(
                                    group=group.name,
                                    row=row,
                                    job=job.name,
                                    phase=slot.phase,
                                    start=k * c + begin,
                                    end=k * c + end,
                                    gpus=tuple(by_row[row]),
                                    cycle=k,
                                    wrapped=wrapped,
                                    phase_start=slot.start_s % c,
                                    phase_duration=slot.duration_s,
                                )
                            )
    return out


def assign_lanes(segments: Iterable[Segment]) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    """(group, row, job, phase) -> (lane, lanes in that row) for the GPU phases.

    Two (job, phase) keys on one row share a lane unless their pieces overlap in cycle 0 (which
    covers the whole circle of the timetable, wrapped tails included); greedy by earliest start.
    A valid plan drawn by GPU always gets one lane per row.
    """
    per_row: dict[tuple[str, str], dict[tuple[str, str], list[tuple[float, float]]]] = {}
    for s in segments:
        if s.phase in GPU_PHASES and s.cycle == 0:
            per_row.setdefault((s.group, s.row), {}).setdefault((s.job, s.phase), []).append((s.start, s.end))
    result: dict[tuple[str, str, str, str], tuple[int, int]] = {}
    for (group, row), keys in per_row.items():
        lanes: list[list[tuple[float, float]]] = []
        chosen: dict[tuple[str, str], int] = {}
        for key in sorted(keys, key=lambda k: (min(b for b, _ in keys[k]), k)):
            ivs = keys[key]
            for i, lane in enumerate(lanes):
                if not any(_overlap(a, b) for a in ivs for b in lane):
                    lane.extend(ivs)
                    chosen[key] = i
                    break
            else:
                lanes.append(list(ivs))
                chosen[key] = len(lanes) - 1
        for (job, phase), lane in chosen.items():
            result[(group, row, job, phase)] = (lane, len(lanes))
    return result


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return min(a[1], b[1]) - max(a[0], b[0]) > 1e-9


def _lane_band(lane: int, lanes: int) -> tuple[float, float]:
    """(top, bottom) offsets of a lane inside the bar band of a row."""
    h = (BAR_BOTTOM - BAR_TOP) / lanes
    return BAR_TOP + lane * h, BAR_TOP + (lane + 1) * h


def job_colours(plan: Plan) -> dict[str, str]:
    """One colour per job, by plan order of the jobs, the same in every group and both renderers."""
    names = [job.name for group in plan.groups for job in group.jobs]
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(dict.fromkeys(names))}


def _rgb(colour: str) -> tuple[float, float, float]:
    colour = colour.lstrip("#")
    return tuple(int(colour[i : i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def _hex(rgb: Iterable[float]) -> str:
    return "#" + "".join(f"{round(max(0.0, min(1.0, v)) * 255):02x}" for v in rgb)


def tint(colour: str, amount: float) -> str:
    """Mix with white (amount > 0) or black (amount < 0)."""
    rgb = _rgb(colour)
    if amount >= 0:
        return _hex(v + (1 - v) * amount for v in rgb)
    return _hex(v * (1 + amount) for v in rgb)


def phase_colour(colour: str, phase: str) -> str:
    return tint(colour, 0.5) if phase == "rollout" else colour


def _text_colour(fill: str) -> str:
    r, g, b = _rgb(fill)
    return "#111111" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#ffffff"


def gpu_summary(gpus: Iterable[str], limit: int = 6) -> str:
    """``rollout-000:0..7, train-000:0,2`` -- GPU ids compressed per node into index runs."""
    per_node: dict[str, list[str]] = {}
    for g in gpus:
        node, sep, idx = g.rpartition(":")
        per_node.setdefault(node if sep else g, []).append(idx if sep else "")
    parts = []
    for node, idxs in per_node.items():
        if idxs == [""]:
            parts.append(node)
            continue
        nums = sorted({int(i) for i in idxs if i.isdigit()})
        runs: list[str] = []
        i = 0
        while i < len(nums):
            j = i
            while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
                j += 1
            runs.append(f"{nums[i]}..{nums[j]}" if j > i else str(nums[i]))
            i = j + 1
        runs += sorted(i for i in idxs if not i.isdigit())
        parts.append(f"{node}:{','.join(runs)}")
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f", ... ({len(parts)} nodes)"
    return ", ".join(parts)


def _check_by(by: str) -> None:
    if by not in ("node", "gpu"):
        raise ValueError(f"by must be 'node' or 'gpu', got {by!r}")


def _money(x: float | None) -> str:
    return "" if x is None else f"${x:,.2f}/h"


def plan_title(plan: Plan, shown: int) -> str:
    bits = [f"Plan: policy {plan.policy}", _money(plan.cost_usd_per_hour)]
    if plan.lower_bound_usd_per_hour is not None:
        bits[-1] += f" (lower bound {_money(plan.lower_bound_usd_per_hour)})"
    bits.append(f"topology {plan.topology}")
    bits.append(f"{len(plan.groups)} group{'s' if len(plan.groups) != 1 else ''}")
    title = ", ".join(bits)
    if len(plan.groups) > shown:
        title += f" ({len(plan.groups) - shown} more groups)"
    if plan.rejected:
        names = [r.name for r in plan.rejected]
        title += "; rejected: " + ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
    return title


def group_title(group: GroupPlan, hidden_rows: int = 0) -> str:
    bits = [group.name, f"cycle {group.cycle_s:.1f} s"]
    if group.usd_per_hour is not None:
        bits.append(_money(group.usd_per_hour))
    bits.append(f"{len(group.nodes)} node{'s' if len(group.nodes) != 1 else ''}")
    jobs = ", ".join(f"{j.name} (x{j.slowdown:.2f} solo)" for j in group.jobs[:6])
    if len(group.jobs) > 6:
        jobs += f", +{len(group.jobs) - 6} more"
    title = " | ".join(bits) + f" | jobs {jobs}"
    if hidden_rows:
        title += f" | {hidden_rows} more rows not drawn"
    return title


@dataclass
class _Panel:
    group: GroupPlan
    rows: list[str]
    hidden_rows: int
    segments: list[Segment]


def _panels(plan: Plan, cycles: int, by: By, max_groups: int) -> tuple[list[_Panel], list[Segment]]:
    segments = phase_segments(plan, cycles, by)
    panels = []
    for group in plan.groups[:max_groups]:
        rows = group_rows(group, by)
        shown = set(rows[:MAX_ROWS])
        segs = [s for s in segments if s.group == group.name and s.row in shown]
        panels.append(_Panel(group, rows[:MAX_ROWS], max(0, len(rows) - MAX_ROWS), segs))
    return panels, segments


def _hover(s: Segment) -> str:
    piece = " (tail of the previous cycle's phase)" if s.wrapped else ""
    return (
        f"<b>{s.job}</b> {s.phase}{piece}<br>"
        f"start {s.start:.2f} s, end {s.end:.2f} s, piece {s.duration:.2f} s<br>"
        f"phase: offset {s.phase_start:.2f} s in cycle, duration {s.phase_duration:.2f} s<br>"
        f"GPUs ({len(s.gpus)}): {gpu_summary(s.gpus)}"
        + ("<br>no GPU time: weights to these receivers" if s.phase == "sync" else "")
    )


# ----------------------------------------------------------------------------------------------
# PNG


def _prepare(plan: Plan, path: str | Path, cycles: int, by: By, max_groups: int):
    """What both drawings need: the output path (its folder made), panels, segments, colours, lanes."""
    _check_by(by)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    panels, segments = _panels(plan, cycles, by, max_groups)
    return path, panels, segments, job_colours(plan), assign_lanes(segments)


def gantt_png(
    plan: Plan, path: str | Path, cycles: int = 2, by: By = "node", max_groups: int = MAX_GROUPS, dpi: int = 110
) -> Path:
    """Draw the plan's timetables to a PNG at ``path`` (see module doc) and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    path, panels, segments, colours, lanes = _prepare(plan, path, cycles, by, max_groups)

    width = 15.0
    heights = [min(12.0, 0.85 + 0.38 * max(1, len(p.rows))) for p in panels] or [1.5]
    total = sum(heights) + 1.0
    if total > 60.0:  # keep the image a sensible size: squeeze every panel alike
        scale = (60.0 - 1.0) / sum(heights)
        heights = [h * scale for h in heights]
        total = 60.0
    fig = Figure(figsize=(width, total), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(_plain(plan_title(plan, len(panels))), fontsize=12, fontweight="bold")

    if not panels:
        ax = fig.add_subplot(1, 1, 1)
        ax.axis("off")
        ax.text(0.5, 0.5, "no groups placed", ha="center", va="center", fontsize=14, transform=ax.transAxes)
        fig.savefig(path, dpi=dpi)
        return path

    axes = fig.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    label_jobs: list[tuple] = []
    for ax, panel in zip(axes, panels):
        group, rows = panel.group, panel.rows
        row_y = {r: i for i, r in enumerate(rows)}
        horizon = cycles * group.cycle_s
        ax.set_facecolor(IDLE_COLOUR)
        ax.set_xlim(0, horizon)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_yticks(range(len(rows)), rows, fontsize=8 if len(rows) <= 24 else 6)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title(_plain(group_title(group, panel.hidden_rows)), fontsize=9.5, loc="left")
        for i in range(len(rows) - 1):
            ax.axhline(i + 0.5, color="white", lw=1.5, zorder=1)
        for k in range(1, cycles):
            ax.axvline(k * group.cycle_s, color="#555555", lw=1.0, ls=(0, (4, 3)), zorder=4)
        for s in panel.segments:
            y = row_y[s.row]
            base = colours[s.job]
            if s.phase == "sync":
                ax.add_patch(
                    Rectangle(
                        (s.start, y + SYNC_TOP), max(s.duration, 0.0), SYNC_BOTTOM - SYNC_TOP,
                        facecolor="white", edgecolor=base, hatch="////", lw=0.8, zorder=3,
                    )
                )  # fmt: skip
                if not s.wrapped:
                    ax.plot(
                        [s.start], [y + (SYNC_TOP + SYNC_BOTTOM) / 2], marker="^", ms=5, color=base,
                        markeredgecolor="black", markeredgewidth=0.5, zorder=5, clip_on=True,
                    )  # fmt: skip
                continue
            lane, n = lanes.get((s.group, s.row, s.job, s.phase), (0, 1))
            top, bottom = _lane_band(lane, n)
            fill = phase_colour(base, s.phase)
            ax.add_patch(
                Rectangle(
                    (s.start, y + top), s.duration, bottom - top,
                    facecolor=fill, edgecolor=tint(base, -0.35), lw=0.8, zorder=2,
                )
            )  # fmt: skip
            label_jobs.append((ax, s, y + (top + bottom) / 2, bottom - top, fill, horizon, len(rows)))
        ax.set_xlabel("time (s)", fontsize=8)

    drawn = {j.name for panel in panels for j in panel.group.jobs}
    handles = [Patch(facecolor=c, edgecolor=tint(c, -0.35), label=j) for j, c in colours.items() if j in drawn]
    handles += [
        Patch(facecolor="#bbbbbb", edgecolor="#555555", label="rollout (light)"),
        Patch(facecolor="#555555", edgecolor="#333333", label="train (full)"),
        Patch(facecolor="white", edgecolor="#555555", hatch="////", label="sync (no GPU time)"),
        Patch(facecolor=IDLE_COLOUR, edgecolor="#999999", label="idle"),
        Line2D([], [], color="#555555", ls=(0, (4, 3)), label="cycle boundary"),
    ]
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, title="jobs", title_fontsize=9, frameon=False)

    # Labels only where they fit: measure the laid-out axes first.
    fig.canvas.draw()
    for ax, s, yc, band, fill, horizon, nrows in label_jobs:
        box = ax.get_window_extent()
        px_per_s = box.width / horizon
        band_px = band * box.height / nrows
        fontsize = 8.0
        if band_px < fontsize * dpi / 72 * 1.15:
            fontsize = band_px / (dpi / 72 * 1.15)
            if fontsize < 5.5:
                continue
        bar_px = s.duration * px_per_s
        char_px = 0.62 * fontsize * dpi / 72
        for text in (f"{s.job} {SHORT[s.phase]}", s.job):
            if len(text) * char_px + 6 <= bar_px:
                t = ax.text(
                    s.start + s.duration / 2, yc, text, ha="center", va="center", fontsize=fontsize,
                    color=_text_colour(fill), zorder=6, clip_on=True,
                )  # fmt: skip
                t.set_in_layout(False)
                break
    fig.savefig(path, dpi=dpi)
    return path


# ----------------------------------------------------------------------------------------------
# HTML


def gantt_html(
    plan: Plan, path: str | Path, cycles: int = 2, by: By = "node", max_groups: int = MAX_GROUPS
) -> Path:
    """Write a self-contained interactive plotly page (plotly.js inlined, works offline)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    path, panels, segments, colours, lanes = _prepare(plan, path, cycles, by, max_groups)

    if not panels:
        fig = go.Figure()
        fig.add_annotation(text="no groups placed", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(title=plan_title(plan, 0), height=300)
        fig.write_html(path, include_plotlyjs=True, full_html=True)
        return path

    heights = [70 + 30 * max(1, len(p.rows)) for p in panels]
    spacing = min(0.12, 0.9 / max(1, len(panels) - 1)) if len(panels) > 1 else 0.0
    spacing = min(spacing, 90 / sum(heights))
    fig = make_subplots(
        rows=len(panels), cols=1, row_heights=[h / sum(heights) for h in heights],
        subplot_titles=[group_title(p.group, p.hidden_rows) for p in panels], vertical_spacing=spacing,
    )  # fmt: skip
    in_legend: set[str] = set()
    for index, panel in enumerate(panels, start=1):
        group, rows = panel.group, panel.rows
        row_y = {r: i for i, r in enumerate(rows)}
        by_key: dict[tuple[str, str], list[Segment]] = {}
        for s in panel.segments:
            by_key.setdefault((s.job, s.phase), []).append(s)
        job_rank = {j: i for i, j in enumerate(colours)}
        for (job, phase), segs in sorted(by_key.items(), key=lambda kv: (job_rank[kv[0][0]], PHASE_ORDER[kv[0][1]])):
            base = colours[job]
            show = job not in in_legend
            in_legend.add(job)
            common = dict(name=job, legendgroup=job, hovertemplate="%{customdata}<extra></extra>")
            hover = [_hover(s) for s in segs]
            if phase == "sync":
                ys = [row_y[s.row] + (SYNC_TOP + SYNC_BOTTOM) / 2 for s in segs]
                fig.add_trace(
                    go.Bar(
                        orientation="h", y=ys, x=[s.duration for s in segs], base=[s.start for s in segs],
                        width=SYNC_BOTTOM - SYNC_TOP, customdata=hover, showlegend=False,
                        marker=dict(color="white", line=dict(color=base, width=1),
                                    pattern=dict(shape="/", fgcolor=base, solidity=0.5)),
                        **common,
                    ),
                    row=index, col=1,
                )  # fmt: skip
                heads = [s for s in segs if not s.wrapped]
                fig.add_trace(
                    go.Scatter(
                        x=[s.start for s in heads], y=[row_y[s.row] + (SYNC_TOP + SYNC_BOTTOM) / 2 for s in heads],
                        mode="markers", customdata=[_hover(s) for s in heads], showlegend=False,
                        marker=dict(symbol="triangle-up", size=8, color=base, line=dict(color="black", width=0.5)),
                        **common,
                    ),
                    row=index, col=1,
                )  # fmt: skip
                continue
            ys, widths = [], []
            for s in segs:
                lane, n = lanes.get((s.group, s.row, s.job, s.phase), (0, 1))
                top, bottom = _lane_band(lane, n)
                ys.append(row_y[s.row] + (top + bottom) / 2)
                widths.append(bottom - top)
            fill = phase_colour(base, phase)
            fig.add_trace(
                go.Bar(
                    orientation="h", y=ys, x=[s.duration for s in segs], base=[s.start for s in segs],
                    width=widths, customdata=hover, showlegend=show,
                    text=[f"{job} {SHORT[phase]}"] * len(segs), textposition="inside",
                    insidetextanchor="middle", textfont=dict(color=_text_colour(fill), size=11),
                    marker=dict(color=fill, line=dict(color=tint(base, -0.35), width=1)),
                    **common,
                ),
                row=index, col=1,
            )  # fmt: skip
        horizon = cycles * group.cycle_s
        fig.update_xaxes(range=[0, horizon], title_text="time (s)", row=index, col=1, showgrid=True, gridcolor="white")
        fig.update_yaxes(
            tickmode="array", tickvals=list(range(len(rows))), ticktext=rows,
            range=[len(rows) - 0.5, -0.5], row=index, col=1, showgrid=False, zeroline=False,
        )  # fmt: skip
        for k in range(1, cycles):
            fig.add_vline(x=k * group.cycle_s, line=dict(color="#555555", width=1, dash="dash"), row=index, col=1)
        for i in range(len(rows) - 1):
            fig.add_hline(y=i + 0.5, line=dict(color="white", width=2), row=index, col=1)
    fig.update_layout(
        title=dict(text=plan_title(plan, len(panels)) + "<br><sup>rollout: light, train: full colour, "
                   "sync: hatched strip under the receivers (no GPU time), idle: grey</sup>"),
        barmode="overlay", plot_bgcolor=IDLE_COLOUR, height=min(20000, sum(heights) + 160),
        legend=dict(title="jobs"), uniformtext=dict(minsize=8, mode="hide"), hoverlabel=dict(align="left"),
        margin=dict(t=110),
    )  # fmt: skip
    for annotation in fig.layout.annotations:
        annotation.update(font=dict(size=12), x=0, xanchor="left")
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


__all__ = [
    "Segment",
    "assign_lanes",
    "gantt_html",
    "gantt_png",
    "gpu_summary",
    "group_rows",
    "job_colours",
    "phase_segments",
]


def _plain(text: str) -> str:
    """Escape dollar signs: matplotlib would read "$542/h ... $" as mathtext."""
    return text.replace("$", r"\$")
