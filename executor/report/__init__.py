"""``weave report DIR``: one self-contained HTML page about a run (issue 8, part 4).

Works on any folder that ``weave simulate --out DIR`` wrote, and on ``weave run`` folders (same
files: records, metrics.json, pictures). Sections, in order:

1. ``run``: headline numbers, inputs, and notes on optional inputs that were not found;
2. ``gantt``: planned vs measured timetable per group (``weave_rl.executor.report.figures.gantt_figure``);
3. ``utilization``: compute / switch / bubble share of held GPU-seconds per pool (cluster), GPUs
   computing over time, bubbles per node, and the run's own utilization picture;
4. ``iterations``: each job's iteration times against its SLO bound, and the per-job table;
5. ``replans``: drift replans (time, job, reason, $/h before and after, moved jobs), then plan
   switches, admissions, restarts and node faults from the controller's log;
6. ``profiles``: profiled vs measured phase durations (``weave_rl.profiles.fit``) and drift detections.

Call ``build_report(folder, out)``; a missing or garbled folder is an ``InputError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weave_rl.executor.report import figures, tables
from weave_rl.executor.report.load import RunData, load_run
from weave_rl.executor.report.page import Page, fmt, png_html, table_html

MAX_GROUPS = 6  # Gantt panels on one page; the rest are counted in a note
CYCLES = 3


@dataclass(frozen=True)
class Report:
    path: Path
    sections: list[str]
    figures: list[str]
    notes: list[str]
    size_bytes: int


def build_report(folder: Path, out: Path | None = None, *, plan: Path | None = None,
                 jobs: Path | None = None) -> Report:
    run = load_run(Path(folder), plan=plan, jobs=jobs)
    out = Path(out) if out is not None else Path(folder) / "report.html"
    page = render(run)
    text = page.render()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return Report(out, [s[0] for s in page.sections], list(page.figures), list(run.notes), len(text.encode()))


def render(run: RunData) -> Page:
    m = run.metrics
    inputs = m.get("inputs") if isinstance(m.get("inputs"), dict) else {}
    page = Page(f"Weave run report: {run.folder.name}",
                f"{run.folder} | {len(run.records):,} records | plan: {run.plan_source or 'none found'}")
    _summary(page.section("run", "Run"), run, inputs)
    _gantt(page, run)
    _utilization(page, run)
    _iterations(page, run)
    _replans(page.section("replans", "Replans and events"), m)
    _profiles(page.section("profiles", "Profile fits"), run)
    return page


def _summary(parts: list[str], run: RunData, inputs: dict) -> None:
    m = run.metrics
    kpis = [("simulated / run time s", m.get("horizon_s", float(run.records["end_s"].max()))),
            ("jobs", m.get("jobs", run.records["job"].nunique())),
            ("iterations", m.get("iterations")), ("avg $/h", m.get("avg_usd_per_hour")),
            ("peak $/h", m.get("peak_usd_per_hour")), ("total $", m.get("usd")),
            ("SLO attainment %", 100 * m["slo_attainment"] if isinstance(m.get("slo_attainment"), (int, float))
             else None), ("restarts", m.get("restarts")), ("replans", len(m.get("replans", [])))]
    parts.append('<div class="kpis">' + "".join(f'<div class="kpi"><b>{fmt(v)}</b><span>{k}</span></div>'
                                                 for k, v in kpis) + "</div>")
    if inputs:
        parts.append("<h3>Inputs</h3>" + table_html(["input", "value"], [[k, v] for k, v in inputs.items()]))
    for note in run.notes:
        parts.append(f'<p class="note">{note}</p>')


def _gantt(page: Page, run: RunData) -> None:
    parts = page.section("gantt", "Planned vs measured timetable")
    frame = run.records
    if run.plan is not None:
        parts.append(f"<p>Top: the timetable of the plan the run started from ({run.plan_source}), {CYCLES} cycles. "
                     "Bottom: what ran over as many seconds, from the middle of the run. Rollout light, train full "
                     "colour, sync a hatched strip, warm switch grey, idle the grey background.</p>")
        groups = [(g.name, g) for g in run.plan.groups]
    else:
        parts.append('<p class="note">No plan found: measured timeline only.</p>')
        groups = [(str(g), None) for g in dict.fromkeys(frame["group"])]
    for name, group in groups[:MAX_GROUPS]:
        if not (frame["group"] == name).any():
            parts.append(f'<p class="note">group {name}: no records (replanned away before it ran?)</p>')
            continue
        parts.append(page.figure(f"gantt-{name}", figures.gantt_figure(frame, run.plan, group, name, CYCLES)))
    if len(groups) > MAX_GROUPS:
        parts.append(f'<p class="note">{len(groups) - MAX_GROUPS} more groups not drawn.</p>')


def _utilization(page: Page, run: RunData) -> None:
    parts = page.section("utilization", "Utilization and bubbles per pool")
    m = run.metrics
    clusters = m.get("clusters") or {}
    if clusters:
        parts.append("<h3>Held GPU-seconds per pool: computing, warm switch, bubble</h3>")
        parts.append(page.figure("pools", figures.pools_figure(clusters)))
        parts.append(table_html(["pool", "held GPU-s", "utilization %", "switch %", "bubble %"],
                                [[c, v.get("held_gpu_s"), 100 * (v.get("utilization") or 0),
                                  100 * (v.get("switch_share") or 0), 100 * (v.get("bubble_share") or 0)]
                                 for c, v in sorted(clusters.items())]))
    horizon = float(m.get("horizon_s") or run.records["end_s"].max())
    parts.append("<h3>GPUs computing over time</h3>")
    parts.append(page.figure("busy", figures.busy_figure(run.records, horizon, m.get("peak_gpus") or {})))
    parts.append("<h3>Bubbles per node (no phase or switch on any of its GPUs)</h3>")
    parts.append(table_html(*tables.node_bubbles(run.records, horizon)))
    if "utilization.png" in run.pictures:
        parts.append(png_html("utilization.png (GPUs held and computing, as the run drew it)",
                              run.pictures["utilization.png"]))


def _iterations(page: Page, run: RunData) -> None:
    parts = page.section("iterations", "Iteration times against the SLO")
    per_job = run.metrics.get("per_job") or {}
    times = figures.iteration_times(run.records)
    parts.append("<p>Each iteration's time (sync end to sync end) over the job's SLO bound, slo x its solo "
                 "iteration with the same sampled durations; above the dashed line at 1 misses the SLO.</p>")
    if per_job:
        palette = figures.colours(run.plan, run.records)
        parts.append(page.figure("iterations", figures.iterations_figure(times, per_job, palette)))
    else:
        parts.append('<p class="note">metrics.json has no per_job entries: no SLO bounds.</p>')
    parts.append(table_html(*tables.jobs_table(per_job, times)))


def _replans(parts: list[str], m: dict) -> None:
    parts.append("<h3>Replans</h3>")
    parts.append(table_html(*tables.replans_table(m), empty="no replans in this run"))
    parts.append("<h3>Plan switches, admissions, restarts, faults</h3>")
    parts.append(table_html(*tables.events_table(m), empty="no events in this run"))


def _profiles(parts: list[str], run: RunData) -> None:
    table, note = tables.profile_fits(run)
    parts.append(f'<p class="note">{note}</p>')
    if table is not None:
        parts.append("<p>Durations on the planned GPUs (records' width_s) refitted as <code>weave profile fit</code> "
                     "would, against the jobs file's profile at the same point.</p>")
        parts.append(table_html(*table))
    parts.append("<h3>Drift detections</h3>")
    parts.append(table_html(*tables.detections_table(run.metrics), empty="no drift detected"))
