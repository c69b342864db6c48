"""``weave run`` on the local backend: a 2-job plan end to end on real worker processes, records fit
by ``weave profile fit``, a worker killed with SIGKILL mid-phase, the controller killed and resumed
(every iteration's samples trained on exactly once), and one-line errors for bad inputs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from weave_rl.profiles.records import RECORD_COLUMNS
from weave_rl.cli.app import main

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 and not torch.cuda.is_available(),
                                reason="the local topology needs two devices")

WEAVE = [sys.executable, "-c", "import sys; from weave_rl.cli.app import run; sys.argv[0] = 'weave'; run()"]
BATCH = 32


def jobs_yaml(steps: int, epochs: int, hidden: int, grpo: bool) -> str:
    block = f"{{kind: bandit, batch: {BATCH}, hidden: {hidden}, steps: {steps}, epochs: {epochs}}}"
    job = """  - name: {name}
    params_b: 0.0001
    slo: 2.0
    rollout: {{gpus: 1, gpu_type: {t}, duration_s: 1.0, host_mem_gb: 0.1}}
    train: {{gpus: 1, gpu_type: {t}, duration_s: 0.8, host_mem_gb: 0.1}}
""" + ("" if grpo else "    workload: {block}\n")  # no workload block: the built-in grpo job
    from weave_rl.topology.topology import load_topology

    t = load_topology("local").gpu_type_of("local-000:0")
    return "jobs:\n" + "".join(job.format(name=n, t=t, block=block) for n in ("A", "B"))


# Both jobs share local-000:0 (rollout) and local-000:1 (train), round-robin: what `weave plan
# --topology local` gives for two such jobs.
PLAN = """version: 1
policy: optimal
quantile: 0.95
topology: local
cost_usd_per_hour: 0.1
solver: {name: hand, status: FEASIBLE, wall_s: 0.0}
groups:
- name: g0
  cycle_s: 2.004
  nodes: [local-000]
  jobs:
  - name: A
    solo_iteration_s: 1.801
    iteration_s: 2.004
    phases:
    - {phase: rollout, start_s: 0.002, duration_s: 1.0, gpus: ['local-000:0'], gpu_type: GT}
    - {phase: train, start_s: 1.002, duration_s: 0.8, gpus: ['local-000:1'], gpu_type: GT}
    - {phase: sync, start_s: 1.802, duration_s: 0.001, gpus: ['local-000:0']}
  - name: B
    solo_iteration_s: 1.801
    iteration_s: 2.004
    phases:
    - {phase: rollout, start_s: 1.004, duration_s: 1.0, gpus: ['local-000:0'], gpu_type: GT}
    - {phase: train, start_s: 0.0, duration_s: 0.8, gpus: ['local-000:1'], gpu_type: GT}
    - {phase: sync, start_s: 0.8, duration_s: 0.001, gpus: ['local-000:0']}
rejected: []
elastic: {}
"""


def write_inputs(folder: Path, steps: int = 4, epochs: int = 1, hidden: int = 64,
                 grpo: bool = False) -> tuple[Path, Path]:
    from weave_rl.topology.topology import load_topology

    folder.mkdir(parents=True, exist_ok=True)
    gpu_type = load_topology("local").gpu_type_of("local-000:0")
    plan, jobs = folder / "plan.yaml", folder / "jobs.yaml"
    plan.write_text(PLAN.replace("GT", gpu_type))
    jobs.write_text(jobs_yaml(steps, epochs, hidden, grpo))
    return plan, jobs


def journal(out: Path) -> list[dict]:
    path = out / "journal.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


@contextlib.contextmanager
def weave_run_in_background(args: list[str]):
    """``weave run ARGS`` in a subprocess (stderr kept). On the way out it is killed if still running,
    and so is every worker pid the test put in the yielded list (a stopped worker would outlive it)."""
    proc = subprocess.Popen([*WEAVE, "run", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victims: list[int] = []
    try:
        yield proc, victims
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def wait_for(what, timeout: float, proc: subprocess.Popen | None = None, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"weave run exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s")


def worker_after_first_iteration(out: Path, proc: subprocess.Popen, gpu: str = "local-000:0") -> dict:
    """Once the run has completed an iteration: the workers.json entry of ``gpu``'s worker."""
    wait_for(lambda: any(e["kind"] == "iteration" for e in journal(out)), 120, proc)
    return next(w for w in json.loads((out / "workers.json").read_text()) if w["gpu"] == gpu)


def expected_ids(job: str, iterations: int) -> list[str]:
    return sorted(f"{job}/{k}/0/{i}" for k in range(iterations) for i in range(BATCH))


def test_plan_is_valid(tmp_path):
    from weave_rl.planner.check import check_plan
    from weave_rl.planner.plan import load_plan
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    plan, jobs = write_inputs(tmp_path)
    assert check_plan(load_plan(plan), load_topology("local"), load_jobs(jobs)) == []


def test_run_end_to_end_writes_outputs_and_records_fit(tmp_path):
    """Two GRPO jobs (the built-in workload: 8 prompts x 8 responses per iteration) share two workers."""
    plan, jobs = write_inputs(tmp_path / "in", grpo=True)
    per_iteration = 64
    out = tmp_path / "run"
    proc = subprocess.run([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    assert {"records.parquet", "records.csv", "metrics.json", "job_metrics.csv", "gantt-g0.png",
            "timeline-g0.html", "utilization.png", "journal.jsonl", "run.json"} <= names
    frame = pd.read_parquet(out / "records.parquet")
    assert set(RECORD_COLUMNS) <= set(frame.columns)
    assert len(frame) == 2 * 3 * 3  # two jobs, three iterations, rollout + train + sync
    counts = frame.groupby(["job", "iteration", "phase"]).size()
    assert (counts == 1).all() and len(counts) == 18
    rollout = frame[frame.phase == "rollout"]
    assert (rollout.tokens > 0).all() and frame[frame.phase != "rollout"].tokens.isna().all()
    assert (frame[frame.phase != "sync"].switch_s > 0).all()
    assert (frame.duration_s > 0).all() and (frame.gpu_type == rollout.gpu_type.iloc[0]).all()
    data = json.loads((out / "metrics.json").read_text())
    assert data["iterations"] == 6 and data["backend"] == "local" and data["permit_latency"]["n"] == 12
    metrics = pd.read_csv(out / "job_metrics.csv")
    assert sorted(zip(metrics.job, metrics.iteration)) == [(j, k) for j in "AB" for k in range(3)]
    assert metrics.reward_mean.between(0, 1).all() and metrics.loss.notna().all()
    assert list(metrics[metrics.job == "A"].ledger) == [per_iteration, 2 * per_iteration, 3 * per_iteration]
    assert (metrics.sync_bytes > 0).all()  # the policy went over torch.distributed
    # The records refit the jobs file.
    fitted = tmp_path / "fitted.yaml"
    assert main(["profile", "fit", str(out / "records.parquet"), "--jobs", str(jobs), "-o", str(fitted)]) == 0
    from weave_rl.profiles.jobs import load_jobs

    spec = load_jobs(fitted)["A"]
    mine = rollout[rollout.job == "A"]
    measured = mine.width_s + mine.after_s  # as the plan sees it: on its planned GPUs, devices held after it
    assert spec.rollout.duration_s.quantile(0.5) == pytest.approx(measured.median(), rel=1e-6)
    assert spec.rollout.duration_s.quantile(0.5) != 1.0


def test_worker_kill_and_controller_kill_then_resume(tmp_path):
    """SIGKILL a worker mid-phase: noticed within 5 s, restarted, the phase re-run; then SIGKILL the
    controller and --resume: every iteration's samples are trained on exactly once."""
    # Rollouts (~0.1 s) dominate, so the rollout worker is busy nearly all the time.
    plan, jobs = write_inputs(tmp_path / "in", steps=3000, epochs=10, hidden=256)
    out = tmp_path / "run"
    n = 10
    proc = subprocess.Popen([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", str(n), "--no-plots",
                             "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        done = lambda: sum(1 for e in journal(out) if e["kind"] == "iteration")  # noqa: E731
        wait_for(lambda: done() >= 1, 120, proc)
        workers = json.loads((out / "workers.json").read_text())
        victim = next(w for w in workers if w["gpu"] == "local-000:0")  # rolls out for both jobs
        killed = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        restarted = wait_for(lambda: [w for w in json.loads((out / "workers.json").read_text())
                                      if w["gpu"] == "local-000:0" and w["incarnation"] == 1], 10, proc, 0.01)
        assert time.monotonic() - killed < 5.0
        assert restarted[0]["pid"] != victim["pid"]
        died = wait_for(lambda: [e for e in journal(out) if e.get("event") == "worker_died"], 10, proc)
        assert died[0]["gpu"] == "local-000:0" and died[0]["rerun"], "the kill should hit a running phase"
        before = done()
        wait_for(lambda: done() >= before + 2, 120, proc)  # recovered: iterations complete again
        assert done() < 2 * n, "the run finished before the controller could be killed"
        workers = json.loads((out / "workers.json").read_text())
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The workers follow their controller.
    for w in workers:
        wait_for(lambda: not _alive(w["pid"]), 10)
    resumed = subprocess.run([*WEAVE, "run", "--resume", str(out), "--no-plots", "--json"], capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    check_exactly_once(out, n)


def check_exactly_once(out: Path, n: int, job_rows: list[dict] | None = None) -> None:
    """Jobs A and B ran n iterations each: every phase recorded once, each train checkpoint's ledger
    holds exactly its samples (none lost, none trained on twice), one metrics row per iteration."""
    frame = pd.read_csv(out / "records.csv") if (out / "records.csv").exists() else None
    if frame is not None:
        counts = frame.groupby(["job", "iteration", "phase"]).size()
        assert len(counts) == 2 * n * 3 and (counts == 1).all()
    for job in ("A", "B"):
        ck = torch.load(out / "checkpoints" / job / f"train-{n - 1}.pt", weights_only=False)
        assert ck["iteration"] == n - 1
        assert sorted(ck["ledger"]) == expected_ids(job, n)  # none lost, none trained on twice
    rows = pd.DataFrame(job_rows) if job_rows is not None else pd.read_csv(out / "job_metrics.csv")
    assert sorted(zip(rows.job, rows.iteration)) == [(j, k) for j in "AB" for k in range(n)]
    assert (rows.ledger == (rows.iteration + 1) * BATCH).all() and (rows.ledger_unique == rows.ledger).all()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its dead parent's reaper) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("case", ["missing-plan", "mismatch", "bad-map-device", "bad-map-gpu", "resume-empty"])
def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys, case):
    plan, jobs = write_inputs(tmp_path / "in")
    out = str(tmp_path / "run")
    if case == "missing-plan":
        args, needle = [str(tmp_path / "nope.yaml"), "--jobs", str(jobs), "--out", out], "nope.yaml: file not found"
    elif case == "mismatch":
        only_a = tmp_path / "only-a.yaml"
        text = jobs.read_text()
        only_a.write_text(text[:text.index("  - name: B")])
        args, needle = [str(plan), "--jobs", str(only_a), "--out", out], "only-a.yaml: jobs: plan job 'B'"
    elif case == "bad-map-device":
        args, needle = [str(plan), "--jobs", str(jobs), "--map", "local-000:0=tpu:0", "--out", out], "--map: bad device"
    elif case == "bad-map-gpu":
        args, needle = [str(plan), "--jobs", str(jobs), "--map", "train-000:0=cpu:0", "--out", out], \
            "--map: GPU 'train-000:0' is not in the plan"
    else:
        args, needle = ["--resume", str(tmp_path)], "run.json: not a weave run folder"
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def run_data_parallel(out: Path, workload: dict, iterations: int = 2):
    """One job ``A``, rollout on two GPUs (two shards) and train on two (gloo all-reduce), four logical
    GPUs sharing this machine's devices round-robin: ``run_plan_local``'s result."""
    from weave_rl.executor.local.devices import map_devices
    from weave_rl.executor.local.run import run_plan_local
    from weave_rl.planner.plan import plan_from_data
    from weave_rl.profiles.jobs import jobs_from_data
    from weave_rl.topology.topology import topology_from_data

    topo = topology_from_data({"name": "dp", "clusters": [{"name": "local", "gpu_type": "CPU", "nodes": 2,
                                                           "gpus_per_node": 2, "host_mem_gb": 16}]})
    phase = {"gpus": 2, "gpu_type": "CPU", "duration_s": 1.0, "host_mem_gb": 0.1}
    jobs = jobs_from_data({"jobs": [{"name": "A", "params_b": 0.0001, "rollout": phase, "train": phase,
                                     "workload": workload}]}, "<test>")
    r, t = ["local-000:0", "local-000:1"], ["local-001:0", "local-001:1"]
    plan = plan_from_data({"version": 1, "policy": "solo", "quantile": 0.95, "topology": "dp", "cost_usd_per_hour": 0.2,
                           "solver": {"name": "hand", "status": "FEASIBLE", "wall_s": 0.0},
                           "groups": [{"name": "g0", "cycle_s": 2.1, "nodes": ["local-000", "local-001"], "jobs": [
                               {"name": "A", "solo_iteration_s": 2.1, "iteration_s": 2.1, "phases": [
                                   {"phase": "rollout", "start_s": 0.0, "duration_s": 1.0, "gpus": r, "gpu_type": "CPU"},
                                   {"phase": "train", "start_s": 1.0, "duration_s": 1.0, "gpus": t, "gpu_type": "CPU"},
                                   {"phase": "sync", "start_s": 2.0, "duration_s": 0.1, "gpus": r}]}]}]})
    return run_plan_local(plan, topo, jobs, out, iterations=iterations,
                          devices=map_devices(r + t, None, ["cpu:0", "cpu:1"]))


def test_data_parallel_train_and_sharded_rollout(tmp_path):
    """The library call behind weave run, on two rollout shards and two data-parallel train ranks."""
    res = run_data_parallel(tmp_path, {"kind": "bandit", "batch": 30, "hidden": 32})
    rows = {row["iteration"]: row for row in res.job_rows}
    assert [rows[k]["samples"] for k in (0, 1)] == [30, 30]  # two shards of 15
    assert [rows[k]["trained_samples"] for k in (0, 1)] == [30, 30]  # two ranks of 15
    assert [rows[k]["ledger"] for k in (0, 1)] == [30, 60] and rows[1]["ledger_unique"] == 60
    assert sorted((tmp_path / "samples" / "A" / "1").glob("shard-*.pt")) == \
        [tmp_path / "samples" / "A" / "1" / f"shard-{i}.pt" for i in (0, 1)]
    ck = torch.load(tmp_path / "checkpoints" / "A" / "train-1.pt", weights_only=False)
    policy = torch.load(tmp_path / "checkpoints" / "A" / "policy-1.pt", weights_only=False)
    assert torch.equal(ck["state"]["w1"], policy["w1"]) and float(ck["state"]["step"]) == 2


def test_two_jobs_time_sharing_one_device_are_planned_and_run(tmp_path):
    """On a one-device topology two jobs fit only by time-sharing it (each role of each job takes
    its turn on the device, warm switches between): `weave plan` forms that pool and `weave run`
    runs it, every iteration once, each job's samples trained on once."""
    from weave_rl.planner.plan import load_plan
    from weave_rl.topology.topology import load_topology

    gpu_type = load_topology("local").gpu_type_of("local-000:0")
    topo = tmp_path / "one.yaml"
    topo.write_text(f"name: one\nclusters:\n  - {{name: one, gpu_type: {gpu_type}, nodes: 1, gpus_per_node: 1, "
                    "host_mem_gb: 16}\n")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(jobs_yaml(4, 1, 64, False).replace("slo: 2.0", "slo: 4.0"))
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "-t", str(topo), "-j", str(jobs), "-o", str(plan), "--time-limit", "5"]) == 0
    (group,) = load_plan(plan).groups
    assert sorted(j.name for j in group.jobs) == ["A", "B"]
    assert {g for j in group.jobs for s in j.phases if s.phase != "sync" for g in s.gpus} == {"one-000:0"}
    out = tmp_path / "run"
    proc = subprocess.run([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    frame = pd.read_parquet(out / "records.parquet")
    counts = frame.groupby(["job", "iteration", "phase"]).size()
    assert (counts == 1).all() and len(counts) == 18
    metrics = pd.read_csv(out / "job_metrics.csv")
    for job in "AB":
        assert list(metrics[metrics.job == job].ledger) == [BATCH, 2 * BATCH, 3 * BATCH]
