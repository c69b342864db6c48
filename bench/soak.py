"""Soak: a long run on real workers under repeated faults, then the exactly-once verdict.

Run from the repository root::

    .venv/bin/python -m bench.soak [--iterations 200] [--kill-every 5] [--stop-s 20] [--heartbeat 5]

The plan is the 2-job round-robin plan of ``tests/test_local_run.py`` (both jobs roll out on
``local-000:0`` and train on ``local-000:1``, the ``bandit`` workload), run by ``weave run`` in a
subprocess for ``--iterations`` iterations per job. While it runs:

- a random worker is killed (SIGKILL) every ``--kill-every`` seconds (+-50 %);
- once, a worker is stopped (SIGSTOP) for ``--stop-s`` seconds: the heartbeat (``--heartbeat``)
  must catch it, kill it and restart it;
- twice, the controller itself is killed (SIGKILL), then ``weave run --resume`` continues.

Printed: faults injected, deaths and restarts the controller logged, hangs it detected (with the
seconds of silence), resumes, wall time, and the verdict: every phase of every iteration recorded
once, every train checkpoint's ledger exactly its iteration's samples (none lost, none trained on
twice), one metrics row per iteration. Exit code 1 when the verdict fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEAVE = [sys.executable, "-c", "import sys; from weave_rl.cli.app import run; sys.argv[0] = 'weave'; run()"]


def journal(out: Path) -> list[dict]:
    rows = []
    path = out / "journal.jsonl"
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def completed(out: Path) -> int:
    return sum(1 for e in journal(out) if e["kind"] == "iteration")


def workers(out: Path) -> list[dict]:
    try:
        return json.loads((out / "workers.json").read_text())
    except (OSError, json.JSONDecodeError):
        return []


def verdict(out: Path, n: int) -> list[str]:
    """Every problem of exactly-once (empty: it holds)."""
    import pandas as pd
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from test_local_run import expected_ids

    problems = []
    frame = pd.read_csv(out / "records.csv")
    counts = frame.groupby(["job", "iteration", "phase"]).size()
    if len(counts) != 2 * n * 3 or not (counts == 1).all():
        problems.append(f"records: {len(counts)} (job, iteration, phase) of {2 * n * 3}, "
                        f"{int((counts > 1).sum())} recorded more than once")
    for job in ("A", "B"):
        ck = torch.load(out / "checkpoints" / job / f"train-{n - 1}.pt", weights_only=True)
        ledger = sorted(ck["ledger"])
        want = expected_ids(job, n)
        if ledger != want:
            problems.append(f"{job}: ledger holds {len(ledger)} ids ({len(set(ledger))} distinct), expected {len(want)}")
    rows = pd.read_csv(out / "job_metrics.csv")
    if sorted(zip(rows.job, rows.iteration)) != [(j, k) for j in "AB" for k in range(n)]:
        problems.append(f"job_metrics.csv: {len(rows)} rows for {2 * n} iterations")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between worker kills (mean)")
    parser.add_argument("--stop-s", type=float, default=20.0, help="how long one worker stays SIGSTOPped")
    parser.add_argument("--heartbeat", type=float, default=5.0, help="weave run --heartbeat-timeout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sys.path.insert(0, str(ROOT / "tests"))
    from test_local_run import write_inputs

    base = args.out or Path(tempfile.mkdtemp(prefix="weave-soak-"))
    plan, jobs = write_inputs(base / "in", steps=600, epochs=4, hidden=128)
    out = base / "run"
    n = args.iterations
    first = [*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", str(n), "--no-plots", "--no-replan",
             "--heartbeat-timeout", str(args.heartbeat), "--out", str(out)]
    resume = [*WEAVE, "run", "--resume", str(out), "--no-plots", "--heartbeat-timeout", str(args.heartbeat)]
    # Controller kills at a third and two thirds of the run; the SIGSTOP in the first leg.
    crash_at = [n * 2 // 3, n * 4 // 3]
    kills, stops, resumes = 0, 0, 0
    stopped: tuple[int, float] | None = None  # (pid, SIGCONT time) of the stopped worker
    started = time.monotonic()
    command = first
    while True:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * args.kill_every
        while proc.poll() is None:
            time.sleep(0.1)
            done = completed(out)
            if crash_at and done >= crash_at[0]:
                crash_at.pop(0)
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                break
            live = [w for w in workers(out) if w.get("pid")]
            if stopped is not None and time.monotonic() >= stopped[1]:
                try:
                    os.kill(stopped[0], signal.SIGCONT)  # gone already if the heartbeat caught it
                except ProcessLookupError:
                    pass
                stopped = None
            if stops == 0 and done >= n // 6 and live:
                victim = rng.choice(live)
                os.kill(victim["pid"], signal.SIGSTOP)
                stops += 1
                stopped = (victim["pid"], time.monotonic() + args.stop_s)
                print(f"t={time.monotonic() - started:7.1f} s  SIGSTOP {victim['gpu']} (pid {victim['pid']}) "
                      f"for {args.stop_s:g} s", flush=True)
            elif time.monotonic() >= next_kill and live and stopped is None:
                victim = rng.choice(live)
                try:
                    os.kill(victim["pid"], signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * args.kill_every
        if proc.returncode == 0:
            break
        if proc.returncode != -signal.SIGKILL:
            print(f"weave run failed (exit {proc.returncode}):\n{proc.stderr.read()[-3000:]}")
            return 1
        resumes += 1
        print(f"t={time.monotonic() - started:7.1f} s  controller killed at {completed(out)} iterations; "
              "--resume", flush=True)
        time.sleep(1.0)  # its workers follow it
        command = resume
    wall = time.monotonic() - started
    entries = journal(out)
    died = [e for e in entries if e.get("event") == "worker_died"]
    hung = [e for e in entries if e.get("event") == "worker_hung"]
    print(f"\n{n} iterations x 2 jobs in {wall:.0f} s wall")
    print(f"faults: {kills} worker SIGKILLs, {stops} SIGSTOP of {args.stop_s:g} s, {resumes} controller kills")
    caught = ", ".join(f"{e['gpu']} after {e['silent_s']:.1f} s silent" for e in hung) or "none"
    resumed = sum(1 for e in entries if e["kind"] == "resume")
    print(f"controller saw: {len(died)} worker deaths (all restarted), {len(hung)} hung ({caught}), "
          f"{resumed} resumes")
    problems = verdict(out, n)
    print("exactly-once:", "HOLDS (records, ledgers, metrics rows)" if not problems else "FAILS")
    for p in problems:
        print("  -", p)
    print(f"run folder: {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
