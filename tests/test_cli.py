"""The command line: tables and JSON, and every user mistake as one line with exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from weave_rl.cli.app import main

GOOD_JOB = {
    "name": "A", "params_b": 7, "slo": 1.5,
    "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": 120, "host_mem_gb": 275.7},
    "train": {"gpus": 8, "gpu_type": "H800", "duration_s": 100, "host_mem_gb": 240},
}


def write_jobs(tmp_path: Path, jobs: list, name: str = "jobs.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"jobs": jobs}))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weave_rl.cli.app", *args], capture_output=True, text=True, timeout=120)


def test_version(capsys):
    assert main(["--version"]) == 0
    assert "weave 0.1.0" in capsys.readouterr().out


def test_topology_show_json(capsys):
    assert main(["topology", "show", "weave-testbed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["gpus"] == 656
    assert data["summary"]["usd_per_hour"] == pytest.approx(2338.64)


def test_jobs_generate_and_show(tmp_path, capsys):
    out = tmp_path / "mixed.yaml"
    assert main(["jobs", "generate", "Mixed", "--count", "5", "--seed", "3", "-o", str(out)]) == 0
    assert main(["jobs", "show", str(out), "--topology", "weave-testbed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert len(data["jobs"]) == 5


def test_profile_fit_roundtrip(tmp_path):
    from weave_rl.profiles.records import records_frame, write_records

    jobs = write_jobs(tmp_path, [GOOD_JOB])
    rows = [{"job": "A", "iteration": i, "phase": "rollout", "gpus": 8, "gpu_type": "H20", "start_s": 300.0 * i,
             "duration_s": d, "switch_s": 0.9, "tokens": 1000} for i, d in enumerate([100.0, 110.0, 130.0])]
    records = tmp_path / "rec.parquet"
    write_records(records_frame(rows), records)
    out = tmp_path / "fitted.yaml"
    assert main(["profile", "fit", str(records), "--jobs", str(jobs), "-o", str(out)]) == 0
    fitted = yaml.safe_load(out.read_text())["jobs"][0]
    assert fitted["rollout"]["duration_s"]["p50"] == pytest.approx(110.0)
    assert fitted["train"]["duration_s"] == 100


def bad_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    def job(**changes):
        data = json.loads(json.dumps(GOOD_JOB))
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            node = data
            for p in parents:
                node = node[p]
            node[leaf] = value
        return data

    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("jobs:\n  - name: A\n    rollout: [1, 2\n")
    cases = [
        (["jobs", "show", str(malformed)], "malformed YAML"),
        (["jobs", "show", str(write_jobs(tmp_path, [job(colour="red")], "k.yaml"))], "jobs[0].colour: unknown key"),
        (["jobs", "show", str(write_jobs(tmp_path, [job(rollout__gpus="eight")], "t.yaml"))], "jobs[0].rollout.gpus"),
        (["jobs", "show", str(write_jobs(tmp_path, [job(train__duration_s=0)], "z.yaml"))],
         "jobs[0].train.duration_s"),
        (["jobs", "show", str(write_jobs(tmp_path, [job(train__duration_s=-5)], "n.yaml"))],
         "jobs[0].train.duration_s"),
        (["jobs", "show", str(write_jobs(tmp_path, [job(rollout__gpu_type="H999")], "g.yaml"))],
         "jobs[0].rollout.gpu_type: unknown GPU type 'H999'"),
        (["jobs", "show", str(write_jobs(tmp_path, [job(rollout__gpus=4096)], "w.yaml")), "--topology",
          "weave-testbed"], "jobs[0].rollout.gpus: 4096 GPUs is wider than every cluster"),
        (["jobs", "show", str(tmp_path / "missing.yaml")], "missing.yaml: file not found"),
        (["topology", "show", "no-such-preset"], "unknown topology preset"),
        (["plan", "--topology", "weave-testbed", "--jobs", str(tmp_path / "missing.yaml")], "file not found"),
        (["jobs", "show", str(write_jobs(tmp_path, [GOOD_JOB], "q.yaml")), "--quantile", "1.5"], "--quantile"),
    ]
    return cases


def test_every_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, expected in bad_cases(tmp_path):
        proc = run_cli(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert expected in proc.stderr.replace("\n", ""), (args, proc.stderr)


def test_plan_writes_checks_and_shows(tmp_path):
    jobs = write_jobs(tmp_path, [GOOD_JOB, {**GOOD_JOB, "name": "B", "slo": 2.0,
                                            "rollout": {**GOOD_JOB["rollout"], "duration_s": 60},
                                            "train": {**GOOD_JOB["train"], "duration_s": 50}}])
    plan = tmp_path / "plan.yaml"
    proc = run_cli("plan", "--topology", "weave-testbed", "--jobs", str(jobs), "-o", str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "$57.04/h" in proc.stdout  # both jobs share one rollout and one train node
    proc = run_cli("plan", "check", str(plan), "--topology", "weave-testbed", "--jobs", str(jobs))
    assert proc.returncode == 0 and "valid" in proc.stdout
    png, html = tmp_path / "g.png", tmp_path / "g.html"
    proc = run_cli("plan", "show", str(plan), "--png", str(png), "--html", str(html), "-t", "weave-testbed")
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plotly" in html.read_text()[:100000]


def test_plan_check_reports_violations_exit_1(tmp_path):
    jobs = write_jobs(tmp_path, [GOOD_JOB])
    plan = tmp_path / "plan.yaml"
    assert run_cli("plan", "-t", "weave-testbed", "-j", str(jobs), "-o", str(plan)).returncode == 0
    data = yaml.safe_load(plan.read_text())
    data["cost_usd_per_hour"] = 1.0
    plan.write_text(yaml.safe_dump(data))
    proc = run_cli("plan", "check", str(plan), "-t", "weave-testbed", "-j", str(jobs))
    assert proc.returncode == 1 and "cost" in proc.stdout


def test_plan_with_rejections_exits_3(tmp_path):
    jobs = write_jobs(tmp_path, [GOOD_JOB, {**GOOD_JOB, "name": "tight", "slo": 0.9},
                                 {**GOOD_JOB, "name": "fat", "rollout": {**GOOD_JOB["rollout"], "host_mem_gb": 5000}}])
    plan = tmp_path / "plan.yaml"
    proc = run_cli("plan", "-t", "weave-testbed", "-j", str(jobs), "-o", str(plan))
    assert proc.returncode == 3, proc.stderr
    assert "tight" in proc.stderr and "SLO" in proc.stderr and "fat" in proc.stderr
    written = yaml.safe_load(plan.read_text())
    assert {r["name"] for r in written["rejected"]} == {"tight", "fat"}
    assert [j["name"] for g in written["groups"] for j in g["jobs"]] == ["A"]


def test_plan_release_with_the_same_jobs_file_checks_the_rest(tmp_path):
    """The jobs file still holds the released job (as a user's does): the new plan is checked against
    the jobs left, and the released one is gone from it."""
    inputs = Path(__file__).resolve().parents[1] / "plans" / "inputs"
    topo, jobs = str(inputs / "micro-a.topology.yaml"), str(inputs / "micro-a.jobs.yaml")
    plan, after = tmp_path / "p.yaml", tmp_path / "p2.yaml"
    assert main(["plan", "--topology", topo, "--jobs", jobs, "--time-limit", "5", "-o", str(plan)]) == 0
    assert main(["plan", "release", str(plan), "--job", "A1", "--jobs", jobs, "-o", str(after)]) == 0
    released = yaml.safe_load(after.read_text())
    names = [j["name"] for g in released["groups"] for j in g["jobs"]]
    assert "A1" not in names and "A2" in names
