"""``weave profile import`` end to end: a framework log -> records -> ``weave profile fit`` -> ``weave plan``
-> the plan passes the checker; bad inputs are one line on stderr and exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from weave_rl.planner.check import check_plan
from weave_rl.planner.plan import load_plan
from weave_rl.profiles.jobs import load_jobs
from weave_rl.profiles.records import read_records
from weave_rl.topology.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "examples" / "logs"
MICRO_A = ROOT / "plans" / "inputs"


def weave(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weave_rl.cli.app", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


@pytest.mark.parametrize("framework, log, job", [
    ("verl", "verl_console.log", "A1"),
    ("roll", "roll_stdout.log", "A1"),
    ("openrlhf", "openrlhf_wandb.jsonl", "A2"),
])
def test_import_fit_plan_check(tmp_path, framework, log, job):
    records = tmp_path / "records.parquet"
    proc = weave("profile", "import", "--from", framework, str(LOGS / log), "-o", str(records),
                 "--gpu-type", "rollout=H20,train=H800")
    assert proc.returncode == 0, proc.stderr
    assert "skipped" in proc.stderr and "Traceback" not in proc.stderr  # the example logs carry noise on purpose
    assert set(read_records(records)["job"]) == {job}

    fitted = tmp_path / "fitted.yaml"
    proc = weave("profile", "fit", str(records), "--jobs", str(MICRO_A / "micro-a.jobs.yaml"), "-o", str(fitted))
    assert proc.returncode == 0, proc.stderr
    spec = {j["name"]: j for j in yaml.safe_load(fitted.read_text())["jobs"]}[job]
    assert spec["rollout"]["gpus"] == 8 and spec["rollout"]["gpu_type"] == "H20"
    assert spec["train"]["gpus"] == 8 and spec["train"]["gpu_type"] == "H800"
    assert set(spec["rollout"]["duration_s"]) == {"p50", "p95", "max"}

    plan = tmp_path / "plan.yaml"
    topo_file = MICRO_A / "micro-a.topology.yaml"
    proc = weave("plan", "-t", str(topo_file), "-j", str(fitted), "-o", str(plan), "--time-limit", "20")
    assert proc.returncode == 0, proc.stderr
    topo = load_topology(str(topo_file))
    the_plan = load_plan(plan)
    assert check_plan(the_plan, topo, load_jobs(fitted, topo.gpu_types)) == []
    assert not the_plan.rejected and job in the_plan.jobs


def test_verl_fit_values_by_hand(tmp_path):
    records = tmp_path / "r.csv"
    assert weave("profile", "import", "--from", "verl", str(LOGS / "verl_console.log"), "-o", str(records),
                 "--gpu-type", "rollout=H20,train=H800").returncode == 0
    fitted = tmp_path / "f.yaml"
    assert weave("profile", "fit", str(records), "--jobs", str(MICRO_A / "micro-a.jobs.yaml"), "-o",
                 str(fitted)).returncode == 0
    a1 = yaml.safe_load(fitted.read_text())["jobs"][0]
    # rollout 130, 140, 150: numpy p50 140, p95 140 + 0.9 * 10 = 149; train 113.5, 117, 120
    assert a1["rollout"]["duration_s"] == {"p50": 140, "p95": 149, "max": 150}
    assert a1["train"]["duration_s"] == {"p50": 117, "p95": pytest.approx(119.7), "max": 120}


def test_import_json_summary(tmp_path):
    proc = weave("profile", "import", "--from", "roll", str(LOGS / "roll_stdout.log"), "-o",
                 str(tmp_path / "r.parquet"), "--gpu-type", "H800", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 3 and summary["rows"] == {"rollout": 3, "train": 3, "sync": 3}
    assert summary["train"] == {"gpus": 8, "gpu_type": "H800"}


def test_bad_inputs_are_one_line_exit_2(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    out = str(tmp_path / "r.parquet")
    cases = [
        (["--from", "slime", str(LOGS / "verl_console.log"), "-o", out, "--gpu-type", "H800"],
         "--from: unknown framework 'slime' (frameworks: verl, roll, openrlhf)"),
        (["--from", "verl", str(tmp_path / "missing.log"), "-o", out, "--gpu-type", "H800"], "missing.log: file not found"),
        (["--from", "verl", str(empty), "-o", out, "--gpu-type", "H800", "--train-gpus", "8"],
         "empty.log: no usable veRL step (1 line skipped: 1 (not a veRL metrics line))"),
        (["--from", "verl", str(LOGS / "verl_console.log"), "-o", out], "--gpu-type: required"),
        (["--from", "verl", str(LOGS / "verl_console.log"), "-o", str(tmp_path / "r.txt"), "--gpu-type", "H800"],
         "r.txt: unsupported records format"),
        (["--from", "roll", str(LOGS / "roll_stdout.log"), "-o", out, "--gpu-type", "H800", "--config",
          str(tmp_path / "nope.yaml")], "nope.yaml: config file not found"),
    ]
    for args, expected in cases:
        proc = weave("profile", "import", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and expected in lines[0], (args, proc.stderr)
