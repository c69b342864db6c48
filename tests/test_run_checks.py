"""``weave run`` and ``weave simulate`` refuse a plan the checker rejects (exit 2, every violation
listed); ``--no-check`` runs it anyway and the run record says so."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from test_local_run import PLAN, WEAVE, pytestmark, write_inputs  # noqa: F401


def broken(kind: str) -> str:
    plan = yaml.safe_load(PLAN)
    group = plan["groups"][0]
    a, b = group["jobs"]
    if kind == "overlap":  # B rolls out on local-000:0 while A does
        b["phases"][0]["start_s"] = 0.5
    elif kind == "sync-before-train":  # A's weights leave before its train ends
        a["phases"][2]["start_s"] = 1.2
    elif kind == "node-in-two-groups":
        group["jobs"] = [a]
        plan["groups"].append({**group, "name": "g1", "jobs": [b]})
    return yaml.safe_dump(plan, sort_keys=False)


RULES = {"overlap": "[overlap]", "sync-before-train": "[chain]", "node-in-two-groups": "[nodes]"}


@pytest.mark.parametrize("kind", sorted(RULES))
def test_run_refuses_a_plan_the_checker_rejects(tmp_path, kind):
    plan, jobs = write_inputs(tmp_path / "in")
    gpu_type = yaml.safe_load(plan.read_text())["groups"][0]["jobs"][0]["phases"][0]["gpu_type"]
    plan.write_text(broken(kind).replace("GT", gpu_type))
    out = tmp_path / "run"
    proc = subprocess.run([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{plan}: groups: the plan fails the checker" in proc.stderr and "--no-check" in proc.stderr
    assert RULES[kind] in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "journal.jsonl").exists(), "no worker may start"


def test_run_lists_every_violation_and_no_check_runs_it_and_says_so(tmp_path):
    plan, jobs = write_inputs(tmp_path / "in")
    data = yaml.safe_load(plan.read_text())
    data["groups"][0]["jobs"][1]["phases"][0]["start_s"] = 0.5  # overlap ...
    data["groups"][0]["jobs"][0]["phases"][2]["start_s"] = 1.2  # ... and a sync before its train ends
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "run"
    args = [*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", "2", "--no-plots", "--out", str(out)]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "[overlap]" in refused.stderr and "[chain]" in refused.stderr
    ran = subprocess.run([*args, "--no-check", "--json"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["inputs"]["plan_checked"] is False
    assert json.loads((out / "run.json").read_text())["no_check"] is True


def test_simulate_refuses_a_plan_the_checker_rejects(tmp_path):
    plan, jobs = write_inputs(tmp_path / "in")
    gpu_type = yaml.safe_load(plan.read_text())["groups"][0]["jobs"][0]["phases"][0]["gpu_type"]
    plan.write_text(broken("overlap").replace("GT", gpu_type))
    args = [*WEAVE, "simulate", str(plan), "--jobs", str(jobs), "--iterations", "3", "--no-plots",
            "--out", str(tmp_path / "sim")]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "[overlap]" in refused.stderr
    assert subprocess.run([*args, "--no-check"], capture_output=True, text=True, timeout=120).returncode == 0
