"""Elastic rollouts on real worker processes: a rollout's prompt groups are pulled by the GPUs it
holds, an idle GPU joins a running rollout (lending) and is taken back, the tail moves to fewer GPUs
at the threshold (long-tail migration); every response id is generated once and trained once, also
when a worker is killed (SIGKILL) or stopped (SIGSTOP) while it computes a prompt group.

Micro-benchmark (a) in small: two jobs share a rollout pool of two GPUs and a train pool of one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from test_local_run import WEAVE, journal, wait_for, weave_run_in_background

from weave_rl.executor.prompt_groups import pulled_schedule

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two cores: one per rollout GPU")

BATCH = 64
SHARES = 8  # rollout_shares_per_gpu 4 x 2 planned rollout GPUs
MAP = "rollout-000:0=cpu:0,rollout-000:1=cpu:1,train-000:0=cpu:1"

TOPOLOGY = """name: cpu-pools
clusters:
  - {name: rollout, gpu_type: CPU, nodes: 1, gpus_per_node: 2, host_mem_gb: 8}
  - {name: train, gpu_type: CPU, nodes: 1, gpus_per_node: 1, host_mem_gb: 8}
links:
  - {between: [rollout, train], gbps: 100}
"""

JOB = """  - name: {name}
    params_b: 0.0001
    slo: 2.0
    rollout: {{gpus: 2, gpu_type: CPU, duration_s: 1.0, host_mem_gb: 0.1}}
    train: {{gpus: 1, gpu_type: CPU, duration_s: 0.3, host_mem_gb: 0.1}}
    workload: {{kind: bandit, batch: {batch}, hidden: {hidden}, steps: {steps}, epochs: 1}}
"""

# What `weave plan -j jobs.yaml -t topology.yaml` gives for the two jobs: one group, round-robin (job,
# rollout start, train start, sync start).
TIMETABLE = (("A", 0.002, 1.002, 1.302), ("B", 1.004, 0.0, 0.3))
PLAN_JOB = """  - name: {name}
    solo_iteration_s: 1.301
    iteration_s: 2.004
    slo: 2.0
    phases:
    - {{phase: rollout, start_s: {rollout}, duration_s: 1.0, gpus: [{rollout_gpus}], gpu_type: CPU}}
    - {{phase: train, start_s: {train}, duration_s: 0.3, gpus: ['train-000:0'], gpu_type: CPU}}
    - {{phase: sync, start_s: {sync}, duration_s: 0.001, gpus: [{rollout_gpus}]}}
"""
PLAN = """version: 1
policy: optimal
quantile: 0.95
topology: cpu-pools
cost_usd_per_hour: 0.15
solver: {{name: cpsat, status: OPTIMAL, wall_s: 1.0}}
groups:
- name: g0
  cycle_s: 2.004
  nodes: [train-000, rollout-000]
  jobs:
{jobs}  usd_per_hour: 0.15
rejected: []
elastic:
  long_tail_migration: {{threshold: 0.8, target_share: 0.25}}
  lend_idle_gpus: {lend}
"""


def plan_text(lend: bool = True) -> str:
    jobs = "".join(PLAN_JOB.format(name=name, rollout=r, train=t, sync=y, rollout_gpus="'rollout-000:0', 'rollout-000:1'")
                   for name, r, t, y in TIMETABLE)
    return PLAN.format(jobs=jobs, lend="true" if lend else "false")


def write_inputs(folder: Path, *, steps: int = 200, hidden: int = 64, lend: bool = True) -> tuple[Path, Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    topo, jobs, plan = folder / "topology.yaml", folder / "jobs.yaml", folder / "plan.yaml"
    topo.write_text(TOPOLOGY)
    jobs.write_text("jobs:\n" + "".join(JOB.format(name=n, batch=BATCH, hidden=hidden, steps=steps) for n in "AB"))
    plan.write_text(plan_text(lend))
    return topo, jobs, plan


def run_args(folder: Path, out: Path, n: int, *extra: str) -> list[str]:
    """The arguments of ``weave run`` on the inputs in ``folder``."""
    return [str(folder / "plan.yaml"), "--jobs", str(folder / "jobs.yaml"), "--topology",
            str(folder / "topology.yaml"), "--map", MAP, "--iterations", str(n), "--no-plots", "--no-replan",
            "--out", str(out), *extra]


def expected_ids(job: str, n: int) -> list[str]:
    per = BATCH // SHARES  # the bandit splits its batch evenly over the shares
    return sorted(f"{job}/{k}/{s}/{i}" for k in range(n) for s in range(SHARES) for i in range(per))


def check_exactly_once(out: Path, n: int) -> pd.DataFrame:
    """Every phase recorded once; each job's last train checkpoint holds every response id of every
    iteration exactly once (generated once: one shard file per prompt group; trained once)."""
    frame = pd.read_csv(out / "records.csv")
    counts = frame.groupby(["job", "iteration", "phase"]).size()
    assert len(counts) == 2 * n * 3 and (counts == 1).all()
    for job in "AB":
        ck = torch.load(out / "checkpoints" / job / f"train-{n - 1}.pt", weights_only=False)
        assert sorted(ck["ledger"]) == expected_ids(job, n)
        for k in range(n):
            shards = sorted((out / "samples" / job / str(k)).glob("shard-*.pt"))
            assert [p.name for p in shards] == [f"shard-{s}.pt" for s in range(SHARES)]
    rows = pd.read_csv(out / "job_metrics.csv")
    assert (rows.ledger == (rows.iteration + 1) * BATCH).all() and (rows.ledger_unique == rows.ledger).all()
    return frame


def test_pulled_schedule_by_hand():
    # [3, 1, 1, 1] on 2 GPUs: one takes the 3 s group, the other the three 1 s groups -> ends 1, 2, 3, 3.
    s = pulled_schedule([3, 1, 1, 1], 2, 0.75)
    assert s.makespan_s == 3 and s.threshold_s == 3 and s.tail_share == 0
    # [1, 1, 1, 5]: ends 1, 1, 2, 6; 3 of 4 groups are done at 2 s, 4 of the 6 s are tail.
    s = pulled_schedule([1, 1, 1, 5], 2, 0.75)
    assert s.makespan_s == 6 and s.threshold_s == 2 and s.tail_share == pytest.approx(4 / 6)
    assert pulled_schedule([2, 2], 1, 0.5).makespan_s == 4
    assert pulled_schedule([], 3, 0.8).makespan_s == 0


def test_a_torch_rollout_stops_between_decoding_steps_when_its_group_is_taken_back():
    from weave_rl.executor.rl import GRPOWorkload
    from weave_rl.executor.workload import RolloutCancelled

    w = GRPOWorkload("G", {"group_size": 2, "prompts_per_iteration": 2}, 5)
    w.to_device("rollout", w.initial_state("rollout"), torch.device("cpu"))
    calls = []
    w._cancel_check = lambda: calls.append(1) or len(calls) > 2
    with pytest.raises(RolloutCancelled):
        w.rollout(0, 0, 1)
    assert len(calls) == 3  # stopped at the third decoding step, not at the end of the group
    w._cancel_check = lambda: False
    checked = w.rollout(0, 0, 1)
    w._cancel_check = None
    assert torch.equal(checked.data["response_ids"], w.rollout(0, 0, 1).data["response_ids"])


def test_elastic_rollouts_lend_migrate_and_keep_every_response_exactly_once(tmp_path):
    folder = tmp_path / "in"
    write_inputs(folder)
    n = 4
    out = tmp_path / "run"
    done = subprocess.run([*WEAVE, "run", *run_args(folder, out, n, "--json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = check_exactly_once(out, n)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["elastic"] is True
    rollouts = frame[frame.phase == "rollout"]
    assert (rollouts.shares == SHARES).all() and (rollouts.gpus == 2).all()
    # The train GPU waits for the rollouts most of the time: it is lent to them (3 GPUs computing).
    assert metrics["elastic_actions"]["loans"] > 0 and rollouts.gpus_peak.max() == 3
    # width_s is the pull replayed on the 2 planned GPUs: never shorter than the groups' work / 2.
    assert (rollouts.width_s >= rollouts.share_s_mean * SHARES / 2 - 1e-9).all()

    static = tmp_path / "static"
    done = subprocess.run([*WEAVE, "run", *run_args(folder, static, n, "--static")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = pd.read_csv(static / "records.csv")
    assert json.loads((static / "metrics.json").read_text())["elastic"] is False
    assert "shares" not in frame or frame.shares.isna().all()  # one shard per planned GPU, as planned
    assert sorted(p.name for p in (static / "samples" / "A" / "0").glob("*.pt")) == ["shard-0.pt", "shard-1.pt"]


def _during_a_rollout(out: Path, proc: subprocess.Popen, gpu: str) -> dict:
    """The worker of ``gpu`` once an iteration is done and a rollout of the next one is computing."""
    wait_for(lambda: any(e["kind"] == "iteration" for e in journal(out)), 120, proc)
    time.sleep(0.2)  # rollouts are most of each iteration: this lands inside one
    return next(w for w in json.loads((out / "workers.json").read_text()) if w["gpu"] == gpu)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_worker_lost_in_an_elastic_rollout_loses_no_response_and_repeats_none(tmp_path, how):
    folder = tmp_path / "in"
    write_inputs(folder, steps=3000, hidden=128)  # prompt groups of ~0.1-0.3 s: a loss lands inside one
    n = 5
    out = tmp_path / "run"
    with weave_run_in_background(run_args(folder, out, n, "--heartbeat-timeout", "2")) as (proc, victims):
        victim = _during_a_rollout(out, proc, "rollout-000:1")
        victims.append(victim["pid"])
        os.kill(victim["pid"], signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        died = wait_for(lambda: [e for e in journal(out) if e.get("event") == "worker_died"], 30, proc)
        assert died[0]["gpu"] == "rollout-000:1"
        assert proc.wait(300) == 0, proc.stderr.read()[-3000:]
    if how == "stop":
        assert any(e.get("event") == "worker_hung" for e in journal(out))
    check_exactly_once(out, n)


def test_the_same_elastic_plan_on_ray_actors(tmp_path):
    """The Ray backend runs the elastic rules through the same worker (a private local Ray instance)."""
    pytest.importorskip("ray")
    folder = tmp_path / "in"
    write_inputs(folder)
    n = 3
    out = tmp_path / "run"
    args = [*WEAVE, "run", *[a for a in run_args(folder, out, n) if a not in ("--map", MAP)], "--backend", "ray"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    frame = check_exactly_once(out, n)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["backend"] == "ray" and metrics["elastic"] is True
    assert metrics["elastic_actions"]["loans"] > 0 and frame[frame.phase == "rollout"].gpus_peak.max() == 3


def test_a_worker_killed_computing_a_migrated_tail_loses_no_response(tmp_path):
    """Right after long-tail migration, the worker that kept the tail (holding its last prompt group)
    is killed: it restarts, warms again and regenerates the group; nothing lost or doubled.

    The worker is stopped (SIGSTOP) the moment it is given the rollout's last group, so the kill
    cannot race the group's own report (on a loaded machine the tail's report was often already on
    its way when the controller handled the migration)."""
    from weave_rl.executor.inputs import load_run_inputs
    from weave_rl.executor.local.run import run_plan_local

    folder = tmp_path / "in"
    topo_file, jobs_file, plan_file = write_inputs(folder, steps=6000, hidden=128)
    plan, topo, jobs = load_run_inputs(plan_file, jobs_file, str(topo_file))
    stopped: dict = {}  # the rollout's last group: run, GPU, task, share, worker pid
    killed: list[str] = []
    given_back: list[tuple] = []  # (run, share) of every prompt group that went back to the queue

    def setup(controller, backend):
        migrate, pull, give_back = controller.threshold_reached, backend._pull, backend._give_back

        def pull_and_stop_the_last(ex, g):
            had = ex.tasks.get(g)
            pull(ex, g)
            if not killed and not stopped and not ex.todo and ex.tasks.get(g, had) != had:
                share, task = ex.tasks[g]
                pid = backend.workers[backend.wid_of[g]].pid
                stopped.update(run=ex.run, gpu=g, task=task, share=share, pid=pid)
                os.kill(pid, signal.SIGSTOP)

        def threshold_reached(run):
            before = controller.elastic_counts["migrations"]
            migrate(run)
            if not stopped or stopped["run"] is not run:
                return
            ex = next(ex for ex in backend.execs.values() if ex.run is run)
            still_held = ex.tasks.get(stopped["gpu"], (None, None))[1] == stopped["task"]
            if controller.elastic_counts["migrations"] > before and still_held:
                os.kill(stopped["pid"], signal.SIGKILL)
                killed.append(stopped["gpu"])
            else:  # no migration in this rollout: let the worker go on, try the next one
                os.kill(stopped["pid"], signal.SIGCONT)
                stopped.clear()

        def give_back_recorded(ex, share, wasted_s):
            given_back.append((ex.run, share))
            give_back(ex, share, wasted_s)

        controller.threshold_reached = threshold_reached
        backend._pull = pull_and_stop_the_last
        backend._give_back = give_back_recorded

    n = 4
    devices = dict(part.split("=") for part in MAP.split(","))
    res = run_plan_local(plan, topo, jobs, tmp_path / "run", iterations=n, devices=devices, setup=setup)
    assert killed, "no tail was migrated"
    died = [e for e in res.events if e["event"] == "worker_died"]
    assert [e["gpu"] for e in died] == killed and died[0]["rerun"]
    assert (stopped["run"], stopped["share"]) in given_back  # the killed worker's group was regenerated
    rows = sorted(res.job_rows, key=lambda r: (r["job"], r["iteration"]))
    assert [(r["job"], r["ledger"], r["ledger_unique"]) for r in rows] == [
        (j, BATCH * (k + 1), BATCH * (k + 1)) for j in "AB" for k in range(n)]
    for job in "AB":
        ck = torch.load(tmp_path / "run" / "checkpoints" / job / f"train-{n - 1}.pt", weights_only=False)
        assert sorted(ck["ledger"]) == expected_ids(job, n)
