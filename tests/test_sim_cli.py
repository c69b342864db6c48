"""``weave simulate``: outputs on disk, JSON summary, and one-line errors with exit code 2."""

import json

import pandas as pd
import pytest

from weave_rl.profiles.records import RECORD_COLUMNS
from weave_rl.cli.app import main

PLAN = "plans/micro-a.yaml"
ARGS = ["--jobs", "plans/inputs/micro-a.jobs.yaml", "--topology", "plans/inputs/micro-a.topology.yaml"]


def test_simulate_plan_writes_records_metrics_and_pictures(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", PLAN, *ARGS, "--iterations", "6", "--static", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["gantt-g0.png", "metrics.json", "records.csv", "records.parquet", "timeline-g0.html",
                     "utilization.png"]
    frame = pd.read_parquet(out / "records.parquet")
    assert set(RECORD_COLUMNS) <= set(frame.columns)
    assert len(frame) == 2 * 6 * 3  # two jobs, six iterations, rollout + train + sync
    data = json.loads((out / "metrics.json").read_text())
    assert data["per_job"]["A1"]["steady_iteration_s"] == pytest.approx(282.154, rel=1e-3)
    assert data["avg_usd_per_hour"] == pytest.approx(57.04)
    assert data["slo_attainment"] == 1.0
    assert "A1" in capsys.readouterr().out


def test_simulate_json_with_fault(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["simulate", PLAN, *ARGS, "--iterations", "4", "--fail", "train-000@150+60", "--no-plots",
                 "--json", "--out", str(out)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["restarts"] >= 1
    assert data["iterations"] == 8


@pytest.mark.parametrize("extra, needle", [
    (["--fail", "train-000@x+3"], "--fail: bad fault"),
    (["--fail", "nowhere-000@1+3"], "unknown node 'nowhere-000'"),
    (["--drift", "A1:rollout:1.5"], "--drift: bad drift"),
    (["--drift", "Z:rollout:1.5@10"], "unknown job 'Z'"),
    (["--drift", "increasing:-1"], "M must be > 0"),
    (["--policy", "best"], "unknown policy"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, extra, needle):
    code = main(["simulate", PLAN, *ARGS, "--iterations", "2", "--no-plots", "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_plan_needs_jobs(tmp_path, capsys):
    assert main(["simulate", PLAN, "--out", str(tmp_path)]) == 2
    assert "--jobs" in capsys.readouterr().err


def test_plan_and_jobs_must_match(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n- {name: Q, params_b: 7, rollout: {gpus: 8, gpu_type: H20, duration_s: 10},"
                    " train: {gpus: 8, gpu_type: H800, duration_s: 10}}\n")
    code = main(["simulate", PLAN, "--jobs", str(jobs), "--topology", "plans/inputs/micro-a.topology.yaml",
                 "--out", str(tmp_path / "o")])
    assert code == 2
    assert "plan job 'A1' is not in the jobs file" in capsys.readouterr().err


def test_without_plan_plans_first(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["simulate", *ARGS, "--policy", "solo", "--iterations", "3", "--no-plots", "--json", "--out", str(out)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inputs"]["policy"] == "solo" and data["jobs"] == 1  # one 8+8 node pair: room for one job alone


def test_trace_mode_from_the_command_line(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n"
        "- {name: T1, params_b: 7, iterations: 3, rollout: {gpus: 8, gpu_type: H20, duration_s: 100},"
        " train: {gpus: 8, gpu_type: H800, duration_s: 50}}\n"
        "- {name: T2, params_b: 7, iterations: 2, arrival_s: 30, rollout: {gpus: 8, gpu_type: H20, duration_s: 80},"
        " train: {gpus: 8, gpu_type: H800, duration_s: 40}}\n")
    out = tmp_path / "trace"
    code = main(["simulate", "--topology", "weave-testbed", "--jobs", str(jobs), "--trace", "--no-plots", "--json",
                 "--out", str(out)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["jobs"] == 2 and data["iterations"] == 5 and data["never_admitted"] == []
