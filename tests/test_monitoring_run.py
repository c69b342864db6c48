"""``weave run --metrics-port``: the Prometheus endpoint scraped while real workers run a plan."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from weave_rl.planner.api import make_plan
from weave_rl.planner.plan import save_plan
from weave_rl.profiles.jobs import jobs_from_data, save_jobs
from weave_rl.topology.topology import load_topology

WEAVE = [sys.executable, "-c", "import sys; from weave_rl.cli.app import run; sys.argv[0] = 'weave'; run()"]
FAMILIES = ["weave_phase_duration_seconds", "weave_switch_seconds", "weave_sync_seconds", "weave_queue_depth",
            "weave_pool_idle_ratio", "weave_replans_total", "weave_worker_restarts_total",
            "weave_worker_deaths_total", "weave_iterations_total", "weave_gpus_held", "weave_usd_per_hour"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_jobs():
    phase = {"gpus": 1, "gpu_type": "CPU", "duration_s": 0.15, "host_mem_gb": 0.1}
    return jobs_from_data({"jobs": [
        {"name": name, "params_b": 0.0001, "slo": 2.0, "rollout": phase, "train": phase,
         "workload": {"kind": "grpo", "task": "addition", "seed": seed}} for name, seed in (("A", 1), ("B", 2))
    ]}, "<test>")


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def phase_count(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("weave_phase_duration_seconds_count"))


def test_metrics_endpoint_during_a_real_run(tmp_path):
    topo = load_topology("local")
    jobs = two_jobs()
    plan = make_plan(topo, jobs, quantile=0.5, time_limit_s=10)
    save_plan(plan, tmp_path / "plan.yaml")
    save_jobs(jobs, tmp_path / "jobs.yaml")
    port = free_port()
    proc = subprocess.Popen(WEAVE + ["run", str(tmp_path / "plan.yaml"), "--jobs", str(tmp_path / "jobs.yaml"),
                                     "--iterations", "60", "--no-replan", "--no-plots", "--out", str(tmp_path / "run"),
                                     "--metrics-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    during = last = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            text = scrape(port)
            if text is not None and phase_count(text) >= 4:
                during = text
                break
            time.sleep(0.2)
        running = proc.poll() is None  # the scrape above happened while the workers were running
        # --metrics-linger (default 75 s): the endpoint outlives the run until one scrape reads the final values
        while time.monotonic() < deadline and proc.poll() is None:
            last = scrape(port) or last
            time.sleep(0.3)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert during is not None and running, f"no scrape with finished phases while the run lasted:\n{out}"
    for family in FAMILIES:
        assert f"# TYPE {family} " in during, family
    assert f"metrics on http://127.0.0.1:{port}/metrics" in out
    # Both jobs' phases are in the histogram, by job and phase.
    assert 'weave_phase_duration_seconds_count{job="A",phase="rollout"}' in during
    assert 'weave_gpus_held{cluster="local"} 2.0' in during
    assert "metrics stay on" in out
    assert 'weave_iterations_total{job="A"} 60.0' in last and 'weave_iterations_total{job="B"} 60.0' in last
    with pytest.raises(OSError):  # the server went away with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
