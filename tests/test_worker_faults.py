"""Hung workers and the errors of failed runs: a SIGSTOPped worker is caught by its heartbeat,
killed, restarted and its phase re-run (exactly once); an error text with ``[...]`` in it (gloo's,
a workload's) is printed verbatim with the ``--resume`` hint, never parsed as markup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from test_local_run import (WEAVE, check_exactly_once, journal, pytestmark, wait_for,  # noqa: F401
                            weave_run_in_background, worker_after_first_iteration, write_inputs)


def test_a_stopped_worker_is_detected_by_its_heartbeat_restarted_and_its_phase_rerun(tmp_path):
    plan, jobs = write_inputs(tmp_path / "in", steps=2000, epochs=6, hidden=256)
    out = tmp_path / "run"
    n = 8
    args = [str(plan), "--jobs", str(jobs), "--iterations", str(n), "--no-plots", "--heartbeat-timeout", "2",
            "--out", str(out)]
    with weave_run_in_background(args) as (proc, victims):
        victim = worker_after_first_iteration(out, proc)
        victims.append(victim["pid"])
        stopped = time.monotonic()
        os.kill(victim["pid"], signal.SIGSTOP)
        hung = wait_for(lambda: [e for e in journal(out) if e.get("event") == "worker_hung"], 30, proc)
        detected = time.monotonic() - stopped
        assert hung[0]["gpu"] == "local-000:0" and hung[0]["pid"] == victim["pid"]
        assert 2.0 <= hung[0]["silent_s"] < 4.0
        assert detected < 8.0, f"the hang was noticed after {detected:.1f} s"
        died = wait_for(lambda: [e for e in journal(out) if e.get("event") == "worker_died"], 10, proc)
        assert died[0]["gpu"] == "local-000:0" and died[0]["exit_code"] == -signal.SIGKILL
        assert proc.wait(300) == 0, proc.stderr.read()[-3000:]
    restarted = [w for w in json.loads((out / "workers.json").read_text()) if w["gpu"] == "local-000:0"]
    assert restarted[0]["incarnation"] == 1 and restarted[0]["pid"] != victim["pid"]
    check_exactly_once(out, n)


def test_a_failed_run_prints_the_error_verbatim_with_the_resume_hint(tmp_path):
    from weave_rl.cli import run as cli_run
    from weave_rl.executor.local.backend import WorkerError

    text = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:1234: Connection reset"
    with cli_run.err_console.capture() as cap:
        cli_run._run_failed(WorkerError(f"train of A iteration 3 failed on local-000:1:\n{text}"), tmp_path,
                            internal=False)
    shown = cap.get()
    assert text in shown and f"weave run --resume {tmp_path}" in shown
    assert not (tmp_path / "controller-error.txt").exists()

    with cli_run.err_console.capture() as cap:
        try:
            raise RuntimeError("[bold]not markup[/] and [/x] unbalanced")
        except RuntimeError as exc:
            cli_run._run_failed(exc, tmp_path, internal=True)
    shown = cap.get()
    assert "RuntimeError: [bold]not markup[/] and [/x] unbalanced" in shown
    assert "Traceback" in (tmp_path / "controller-error.txt").read_text()


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    import psutil

    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def test_a_run_listens_on_loopback_only_and_its_store_needs_no_socket(tmp_path):
    """During a run (metrics endpoint on), every listening socket of the controller and its workers is
    on 127.0.0.1: the rendezvous is a FileStore only the run's owner can open, gloo binds loopback."""
    import psutil

    plan, jobs = write_inputs(tmp_path / "in", steps=2000, epochs=6, hidden=256)
    out = tmp_path / "run"
    proc = subprocess.Popen([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", "30", "--no-plots",
                             "--metrics-port", "0", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        done = lambda: sum(1 for e in journal(out) if e["kind"] == "iteration")  # noqa: E731
        wait_for(lambda: done() >= 2, 120, proc)  # both jobs have all-reduced and synced: groups exist
        pids = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        sockets = listening(pids)
        workers = {w["pid"] for w in json.loads((out / "workers.json").read_text())}
    finally:
        proc.kill()
        proc.wait(10)
    assert workers <= pids
    assert sockets, "the metrics endpoint and gloo listen somewhere"
    assert {ip for _, ip, _ in sockets} == {"127.0.0.1"}, sockets
    controller = [s for s in sockets if s[0] == proc.pid]
    assert len(controller) == 1, f"only the metrics endpoint, no rendezvous listener: {controller}"
    rendezvous = out / ".rendezvous"
    assert rendezvous.is_dir() and (rendezvous.stat().st_mode & 0o777) == 0o700
    assert len(list(rendezvous.glob("store-*"))) == 1


def test_weight_sync_headers_are_json_not_pickle():
    import pickle

    import pytest
    import torch

    from weave_rl.executor.local.comm import pack, unpack

    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([7], dtype=torch.int64)}
    header, flat = pack(weights)
    assert json.loads(header) == [["b", "int64", [1]], ["w", "float32", [2, 3]]]
    back = unpack(header, flat)
    assert torch.equal(back["w"], weights["w"]) and torch.equal(back["b"], weights["b"])
    with pytest.raises(ValueError):  # a pickle is not read, let alone run
        unpack(pickle.dumps([("w", "float32", (2, 3))]), flat)
    with pytest.raises(ValueError, match="no torch dtype"):
        unpack(json.dumps([["w", "Tensor", [1]]]).encode(), flat)
