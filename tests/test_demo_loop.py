"""``weave demo``'s real run closes the loop: it fits the profiles from its own records, replans on
them, and prints planned, measured and replanned iteration times side by side."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch
from rich.console import Console

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 and not torch.cuda.is_available(),
                                reason="the local topology needs two devices")


def test_real_run_fits_its_records_and_replans(tmp_path):
    from weave_rl.cli.demo import real_run
    from weave_rl.planner.check import check_plan
    from weave_rl.planner.plan import load_plan
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    console = Console(record=True, width=260)
    assert real_run(tmp_path, console, iterations=4, time_limit_s=5.0) == 0
    topo = load_topology("local")
    fitted = load_jobs(tmp_path / "jobs-fitted.yaml", topo.gpu_types)
    records = pd.read_parquet(tmp_path / "run" / "records.parquet")
    for job in ("add", "sort"):  # the fitted profiles are the run's own measurements
        for phase in ("rollout", "train"):
            # An elastic rollout is refit from width_s, its prompt groups' pull replayed on its planned GPUs,
            # and every phase's time includes after_s (samples written, weights copied, checkpoint).
            rows = records[(records.job == job) & (records.phase == phase)]
            assert (rows.after_s > 0).all()
            measured = rows["width_s" if phase == "rollout" else "duration_s"] + rows.after_s
            assert getattr(fitted[job], phase).duration_s.quantile(0.5) == pytest.approx(measured.median(), rel=1e-6)
    first, again = load_plan(tmp_path / "plan.yaml"), load_plan(tmp_path / "plan-replanned.yaml")
    assert check_plan(again, topo, fitted) == []
    assert first.quantile == again.quantile == 0.5
    text = console.export_text()
    assert "planned, measured, replanned" in text
    metrics = pd.read_json(tmp_path / "run" / "metrics.json", typ="series")
    lines = {line.split()[1]: line for line in text.splitlines() if line.strip().startswith("│ ")}
    for jp in (j for g in first.groups for j in g.jobs):
        row = lines[jp.name]
        measured = metrics["per_job"][jp.name]["steady_iteration_s"]
        # plan, measured and replanned iteration times of this job, side by side, in that order
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[1] == f"{jp.iteration_s:.3f}" and cells[3] == f"{measured:.3f}"
        replanned = [j for g in again.groups for j in g.jobs if j.name == jp.name]
        if replanned:
            assert cells[4] == f"{replanned[0].iteration_s:.3f}"
            assert cells[5] == f"{measured / jp.iteration_s:.2f}x / {measured / replanned[0].iteration_s:.2f}x"
        else:  # the measured profiles can make a job's SLO impossible to keep: said, with the reason
            reason = next(r.reason for r in again.rejected if r.name == jp.name)
            assert cells[4].startswith("rejected: ") and reason.startswith(cells[4][len("rejected: "):].rstrip("…"))
