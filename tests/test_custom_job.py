"""The example of a user's own job (``examples/custom_job``), end to end as a user runs it: ``weave
plan`` on its jobs file, ``weave run`` on the local backend with the example folder on PYTHONPATH
(every worker imports ``digit_policy`` itself), then ``weave profile fit`` on the records; and its
bad inputs as one line, exit 2, before any worker starts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.test_local_run import WEAVE  # how the local run tests start weave
from weave_rl.cli.app import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_job"
JOBS = ("digits-a", "digits-b")
PER_ITERATION = 16 * 8  # batch x group in jobs.yaml
N = 12

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 and not torch.cuda.is_available(),
                                reason="the local topology needs two devices")


def weave(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)}
    return subprocess.run([*WEAVE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def example_plan(tmp_path_factory) -> Path:
    """``weave plan`` on the example's jobs file, as its README says (once for this module)."""
    folder = tmp_path_factory.mktemp("plan")
    planned = weave("plan", "--topology", "local", "--jobs", str(EXAMPLE / "jobs.yaml"), "--time-limit", "5",
                    "-o", "plan.yaml", cwd=folder)
    assert planned.returncode == 0, planned.stderr[-3000:]
    return folder / "plan.yaml"


def test_example_job_plans_runs_and_fits(tmp_path, example_plan):
    jobs = EXAMPLE / "jobs.yaml"
    ran = weave("run", str(example_plan), "--jobs", str(jobs), "--iterations", str(N), "--out", "run", "--no-plots",
                "--no-replan", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = tmp_path / "run"

    # Records: every phase of every iteration once, with the example's token counts.
    frame = pd.read_parquet(out / "records.parquet")
    counts = frame.groupby(["job", "iteration", "phase"]).size()
    assert len(counts) == 2 * N * 3 and (counts == 1).all()
    assert (frame[frame.phase == "rollout"].tokens == PER_ITERATION).all()
    assert (frame.duration_s > 0).all()

    # Ledgers: each job's last train checkpoint consumed exactly the ids its rollouts produced.
    dataset = [(r["prompt"], r["answer"]) for r in rows_of(EXAMPLE / "prompts.jsonl")]
    for job in JOBS:
        ck = torch.load(out / "checkpoints" / job / f"train-{N - 1}.pt", weights_only=False)
        # The plan's elastic rules split each rollout into prompt groups (one shard file each): every
        # id generated once (its global index once per iteration) and trained once.
        generated = [i for k in range(N) for path in sorted((out / "samples" / job / str(k)).glob("shard-*.pt"))
                     for i in torch.load(path, weights_only=True)["ids"]]
        assert sorted(ck["ledger"]) == sorted(generated)
        per_iteration = sorted((int(i.split("/")[1]), int(i.split("/")[3])) for i in generated)
        assert per_iteration == [(k, i) for k in range(N) for i in range(PER_ITERATION)]
        # Rewards, checked by hand on a saved shard: 1 exactly when the pick is the prompt's largest digit.
        shard = torch.load(out / "samples" / job / str(N - 1) / "shard-0.pt", weights_only=True)
        d = shard["data"]
        assert torch.equal(d["reward"], (d["action"] == d["answer"]).float())
        answers = {max(map(int, p)) for p, _ in dataset}
        assert set(d["answer"].tolist()) <= answers and all(a == max(map(int, p)) for p, a in dataset)
    metrics = pd.read_csv(out / "job_metrics.csv")
    assert sorted(zip(metrics.job, metrics.iteration)) == [(j, k) for j in JOBS for k in range(N)]
    assert (metrics.ledger == (metrics.iteration + 1) * PER_ITERATION).all()
    assert (metrics.ledger_unique == metrics.ledger).all()
    for job in JOBS:  # the policy learns: later iterations earn more than the first ones
        r = metrics[metrics.job == job].sort_values("iteration").reward_mean.to_numpy()
        assert r[-4:].mean() > r[:4].mean() + 0.1, r

    # weave profile fit on those records: the measured phase times replace the guesses of jobs.yaml.
    fitted = weave("profile", "fit", "run/records.parquet", "--jobs", str(jobs), "-o", "fitted.yaml", cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    from weave_rl.profiles.jobs import load_jobs

    spec = load_jobs(tmp_path / "fitted.yaml")
    for job in JOBS:
        for phase in ("rollout", "train"):
            # An elastic rollout is refit from width_s, its pull replayed on the planned GPUs, and
            # every phase's time includes after_s (samples written, weights copied, checkpoint).
            rows = frame[(frame.job == job) & (frame.phase == phase)]
            measured = rows["width_s" if phase == "rollout" else "duration_s"] + rows.after_s
            assert getattr(spec[job], phase).duration_s.quantile(0.5) == pytest.approx(measured.median(), rel=1e-6)
        assert spec[job].workload["kind"] == "digit_policy:LargestDigit"  # the job stays the user's


    # The run folder keeps the jobs as checked: the dataset path is absolute, so a --resume (which
    # reads only the run folder) finds the example's prompts file.
    from weave_rl.profiles.jobs import load_jobs as load

    kept = load(out / "jobs.yaml")
    for job in JOBS:
        assert kept[job].workload["dataset"] == str((EXAMPLE / "prompts.jsonl").resolve())
    again = weave("run", "--resume", "run", "--no-plots", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"every job had already finished its {N} iterations" in again.stdout


def hand_plan(folder: Path) -> Path:
    """The two-job round-robin plan of the local run tests, for the example's job names."""
    from tests.test_local_run import PLAN
    from weave_rl.topology.topology import load_topology

    gpu_type = load_topology("local").gpu_type_of("local-000:0")
    plan = folder / "plan.yaml"
    plan.write_text(PLAN.replace("GT", gpu_type).replace("name: A", "name: digits-a").replace("name: B", "name: digits-b"))
    return plan


def test_example_job_on_ray_actors(tmp_path, example_plan):
    """The Ray actors import the user's module themselves too (PYTHONPATH reaches them)."""
    pytest.importorskip("ray")
    n = 3
    ran = weave("run", str(example_plan), "--jobs", str(EXAMPLE / "jobs.yaml"), "--iterations", str(n), "--out", "run",
                "--no-plots", "--no-replan", "--backend", "ray", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    metrics = pd.read_csv(tmp_path / "run" / "job_metrics.csv")
    assert sorted(zip(metrics.job, metrics.iteration)) == [(j, k) for j in JOBS for k in range(n)]
    for job in JOBS:
        ck = torch.load(tmp_path / "run" / "checkpoints" / job / f"train-{n - 1}.pt", weights_only=False)
        trained = sorted((int(i.split("/")[1]), int(i.split("/")[3])) for i in ck["ledger"])  # (iteration, index)
        assert trained == [(k, i) for k in range(n) for i in range(PER_ITERATION)]


def test_example_job_by_entry_point(tmp_path, example_plan, monkeypatch):
    """An installed package's short name (``weave.workloads`` entry point), resolved by every worker."""
    dist = tmp_path / "site" / "digit_jobs-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: digit-jobs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[weave.workloads]\nlargest-digit = digit_policy:LargestDigit\n")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text((EXAMPLE / "jobs.yaml").read_text().replace('"digit_policy:LargestDigit"', "largest-digit")
                    .replace("dataset: prompts.jsonl", f"dataset: {EXAMPLE / 'prompts.jsonl'}"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "site"),
                                                                   os.environ.get("PYTHONPATH", "")])))
    ran = weave("run", str(example_plan), "--jobs", str(jobs), "--iterations", "2", "--out", "run", "--no-plots",
                "--no-replan", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    metrics = pd.read_csv(tmp_path / "run" / "job_metrics.csv")
    assert sorted(zip(metrics.job, metrics.iteration)) == [(j, k) for j in JOBS for k in range(2)]
    assert (metrics.samples == PER_ITERATION).all()


@pytest.fixture
def forget_example():
    """The example module imported in this process is forgotten after the test (as in a fresh one)."""
    import sys

    from weave_rl.executor import workload

    yield
    workload._REGISTRY.pop("digit_policy:LargestDigit", None)
    sys.modules.pop("digit_policy", None)


@pytest.mark.parametrize("change, on_path, needle, problems", [
    ("batch", True, "jobs.yaml: jobs[0].workload.batch: must be a positive integer, got 0", 1),
    ("dataset", True, "jobs.yaml: jobs[0].workload.dataset: ", 1),
    # Both jobs name the module: both are listed, under one header line naming the file.
    (None, False, "jobs[1].workload.kind: workload kind 'digit_policy:LargestDigit': cannot import "
                  "'digit_policy' (ModuleNotFoundError: No module named 'digit_policy') (is its folder on "
                  "PYTHONPATH, or its package installed?)", 2),
])
def test_example_bad_inputs_one_line(tmp_path, capsys, monkeypatch, forget_example, change, on_path, needle,
                                     problems):
    plan = hand_plan(tmp_path)
    text = (EXAMPLE / "jobs.yaml").read_text().replace("dataset: prompts.jsonl",
                                                      f"dataset: {EXAMPLE / 'prompts.jsonl'}")
    if change == "batch":
        text = text.replace("batch: 16", "batch: 0", 1)
    elif change == "dataset":
        text = text.replace(str(EXAMPLE / "prompts.jsonl"), "nowhere.jsonl", 1)
        needle += f"{tmp_path / 'nowhere.jsonl'}: file not found"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(text)
    if on_path:
        monkeypatch.syspath_prepend(str(EXAMPLE))
    assert main(["run", str(plan), "--jobs", str(jobs), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    assert needle in err and "jobs.yaml" in lines[0], err
    assert len(lines) == (1 if problems == 1 else 1 + problems), err
    assert not any((tmp_path / "run" / name).exists() for name in ("run.json", "workers.json"))  # nothing started
