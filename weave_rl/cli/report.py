"""``weave report DIR -o report.html``: one self-contained HTML page about a run.

Thin: ``weave_rl.executor.report.build_report`` reads the folder (``weave simulate --out DIR`` or ``weave run``)
and writes the page; a missing or garbled folder is an ``InputError`` (one line, exit 2).
Registered on the main app by one line at the end of ``weave_rl/cli/app.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from weave_rl.cli.render import console, print_json


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    folder: Path = typer.Argument(..., metavar="DIR",
                                  help="Run folder: records, metrics.json (weave simulate/run --out)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write (default DIR/report.html)."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="Plan to compare with (default: DIR/plan.yaml, "
                                        "else the plan named in metrics.json)."),
    jobs: Optional[Path] = typer.Option(None, "--jobs", "-j", help="Jobs YAML for profile fits (default: "
                                        "DIR/jobs.yaml, else the jobs file named in metrics.json)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write an HTML report of a run: planned vs measured Gantt, utilization, SLOs, replans, profile fits."""
    from weave_rl.executor.report import build_report

    result = build_report(folder, out, plan=plan, jobs=jobs)
    if as_json:
        print_json({"path": str(result.path), "sections": result.sections, "figures": result.figures,
                    "notes": result.notes, "bytes": result.size_bytes})
        return
    console.print(f"wrote {result.path}: {len(result.sections)} sections, {len(result.figures)} charts, "
                  f"{result.size_bytes / 1e6:.1f} MB", highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
