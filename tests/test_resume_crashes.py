"""Exactly-once records across any number of controller crashes: kill -9 the controller at random
moments several times in one run, ``--resume`` after each, and check that every phase of every
iteration is recorded once, every sample trained on once (ledgers), one metrics row per iteration."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pandas as pd

from test_local_run import WEAVE, _alive, check_exactly_once, journal, pytestmark, wait_for, write_inputs  # noqa: F401


def completed(out) -> int:
    return sum(1 for e in journal(out) if e["kind"] == "iteration")


def test_three_controller_crashes_at_random_moments_then_resume(tmp_path):
    rng = random.Random(7)
    # Rollouts of 6,000 decoding steps: the 12 iterations left after the last crash point outlast its
    # 0.4 s delay (at 600 steps a faster machine ran them in under 0.1 s).
    plan, jobs = write_inputs(tmp_path / "in", steps=6000, epochs=4, hidden=128)
    out = tmp_path / "run"
    n = 14
    first = [*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", str(n), "--no-plots", "--out", str(out)]
    resume = [*WEAVE, "run", "--resume", str(out), "--no-plots"]
    crashes = 0
    # Crash points by progress (iterations completed over both jobs), each followed by a random
    # delay: mid-iteration or between iterations, and always well before the run could end.
    for attempt, target in enumerate((4, 10, 16)):
        proc = subprocess.Popen(first if attempt == 0 else resume, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: completed(out) >= target, 120, proc, step=0.02)
            time.sleep(rng.uniform(0.0, 0.4))
            assert proc.poll() is None and completed(out) < 2 * n, "the run ended before the crash"
            workers = json.loads((out / "workers.json").read_text())
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            crashes += 1
        finally:
            if proc.poll() is None:
                proc.kill()
        for w in workers:  # the workers follow their controller
            wait_for(lambda: not _alive(w["pid"]), 10)
    assert crashes == 3
    # Each crash left the records of an unfinished iteration in the journal.
    entries = journal(out)
    assert sum(1 for e in entries if e["kind"] == "resume") == 2
    done = subprocess.run(resume, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    check_exactly_once(out, n)
    frame = pd.read_csv(out / "records.csv")
    assert len(frame) == 2 * n * 3
    assert sorted(frame[frame.phase == "sync"].groupby("job").iteration.apply(list).sum()) == \
        sorted(list(range(n)) * 2)


def test_resume_when_one_job_had_already_finished(tmp_path):
    """The controller died after A's last iteration but before B's: the resumed run holds only B,
    yet its outputs (metrics, plots) cover records of both, and B's last iteration runs once more."""
    plan, jobs = write_inputs(tmp_path / "in")
    out = tmp_path / "run"
    n = 3
    ran = subprocess.run([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", str(n), "--out", str(out),
                          "--no-plots"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    # Cut the journal where B's last iteration was not yet complete (A's was): drop B's rows of it.
    entries = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]

    def b_last(e: dict) -> bool:
        row = e.get("row", e)
        return e["kind"] in ("record", "metric", "iteration") and row.get("job") == "B" \
            and int(row.get("iteration", -1)) == n - 1

    kept = [json.dumps(e) for e in entries if not b_last(e)]
    (out / "journal.jsonl").write_text("\n".join(kept) + "\n")
    resumed = subprocess.run([*WEAVE, "run", "--resume", str(out)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    check_exactly_once(out, n)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["inputs"]["resumed"] == {"A": n, "B": n - 1}
