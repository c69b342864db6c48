"""``weave run --backend ray``: the local backend's 2-job plan on Ray actors of a local Ray cluster
(CPU, loopback): outputs like the local backend's, placement groups and device map recorded, an actor
killed with ``ray.kill`` and another's process killed with SIGKILL mid-run (restarted, the phase re-run,
every sample trained on exactly once), and one-line errors for bad ``--address`` / ``--backend``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from weave_rl.cli.app import main

ray = pytest.importorskip("ray")

from test_local_run import (WEAVE, check_exactly_once, journal, wait_for,  # noqa: E402
                            worker_after_first_iteration, write_inputs)

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 and not torch.cuda.is_available(),
                                reason="the local topology needs two devices")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster on two CPUs for the module (started once: ~3-8 s)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, address="local", logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _inputs(folder: Path, **kw):
    from weave_rl.executor.inputs import load_run_inputs

    plan, jobs = write_inputs(folder, **kw)
    return (plan, jobs), load_run_inputs(plan, jobs, None)


def test_ray_run_outputs_placement_and_ray_kill(cluster, tmp_path):
    """The library call on the fixture's cluster; ray.kill of the rollout actor while it computes."""
    from weave_rl.executor.ray_backend.run import run_plan_ray
    from weave_rl.cli.run import write_run_outputs

    _, (plan, topo, jobs) = _inputs(tmp_path / "in", steps=3000, epochs=10, hidden=256)
    out = tmp_path / "run"
    n = 5
    killed: list[float] = []

    def setup(controller, backend):
        wid = backend.wid_of["local-000:0"]

        def poll():
            busy = any(ex.permitted and "local-000:0" in ex.warmed and "local-000:0" not in ex.results
                       for ex in backend.execs.values())
            if not killed and busy and controller.state["A"].done["sync"] >= 0:
                ray.kill(backend.workers[wid].actor)
                killed.append(backend.now())
            elif not killed:
                backend.call_at(backend.now() + 0.003, poll)

        backend.call_at(0.0, poll)

    res = run_plan_ray(plan, topo, jobs, out, iterations=n, setup=setup)
    assert killed, "the rollout actor was never seen computing"
    died = [e for e in res.events if e["event"] == "worker_died"]
    up = [e for e in res.events if e["event"] == "worker_up"]
    assert len(died) == 1 and died[0]["gpu"] == "local-000:0" and died[0]["rerun"]
    assert died[0]["t"] - killed[0] < 5.0 and up and up[0]["incarnation"] == 1
    data = write_run_outputs(out, res, plots=True, inputs={"backend": "ray"})
    assert data["backend"] == "ray" and data["iterations"] == 2 * n
    names = {p.name for p in out.iterdir()}
    assert {"records.parquet", "records.csv", "metrics.json", "job_metrics.csv", "gantt-g0.png", "timeline-g0.html",
            "utilization.png", "journal.jsonl", "run.json", "workers.json", "ray_placement.json"} <= names
    check_exactly_once(out, n, res.job_rows)
    placement = json.loads((out / "ray_placement.json").read_text())
    assert placement["strategy"] == "STRICT_PACK" and len(placement["nodes"]) == 1
    node = placement["nodes"][0]
    assert node["node"] == "local-000" and [b["gpu"] for b in node["bundles"]] == ["local-000:0", "local-000:1"]
    assert [b["device"] for b in node["bundles"]] == ["cpu:0", "cpu:1"]
    assert {b["placement_group"] for b in node["bundles"]} == {node["placement_group"]}
    workers = {w["gpu"]: w for w in json.loads((out / "workers.json").read_text())}
    assert workers["local-000:0"]["incarnation"] == 1 and workers["local-000:1"]["incarnation"] == 0
    assert all(w["pid"] and w["bundle"] == i for i, w in enumerate(workers.values()))
    # Nothing of the run is left on the cluster (actors killed, placement group removed).
    wait_for(lambda: ray.available_resources().get("CPU") == 2, 15)


def test_cli_joins_cluster_and_survives_sigkill(cluster, tmp_path):
    """weave run --backend ray --address HOST:PORT (the fixture's cluster) in a subprocess; SIGKILL the
    rollout actor's process mid-run: noticed, restarted, every sample trained on exactly once."""
    (plan, jobs), _ = _inputs(tmp_path / "in", steps=3000, epochs=10, hidden=256)
    out = tmp_path / "run"
    n = 6
    proc = subprocess.Popen([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", str(n), "--no-plots",
                             "--no-replan", "--backend", "ray", "--address", cluster, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        done = lambda: sum(1 for e in journal(out) if e["kind"] == "iteration")  # noqa: E731
        wait_for(lambda: done() >= 1, 120, proc)
        victim = next(w for w in json.loads((out / "workers.json").read_text()) if w["gpu"] == "local-000:0")
        killed = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        restarted = wait_for(lambda: [w for w in json.loads((out / "workers.json").read_text())
                                      if w["gpu"] == "local-000:0" and w["incarnation"] == 1 and w["pid"]], 30, proc)
        assert time.monotonic() - killed < 10.0 and restarted[0]["pid"] != victim["pid"]
        died = wait_for(lambda: [e for e in journal(out) if e.get("event") == "worker_died"], 10, proc)
        assert died[0]["gpu"] == "local-000:0" and died[0]["rerun"], "the kill should hit a running phase"
        assert proc.wait(180) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    data = json.loads((out / "metrics.json").read_text())
    assert data["backend"] == "ray" and data["iterations"] == 2 * n
    assert json.loads((out / "run.json").read_text())["backend"] == "ray"
    check_exactly_once(out, n)


def test_a_stopped_actor_is_caught_by_the_heartbeat_and_restarted(cluster, tmp_path):
    """SIGSTOP the rollout actor's process: Ray still counts it alive; its unanswered heartbeat gets it
    killed and restarted within the timeout, and every sample is trained on exactly once."""
    (plan, jobs), _ = _inputs(tmp_path / "in", steps=3000, epochs=10, hidden=256)
    out = tmp_path / "run"
    n = 6
    proc = subprocess.Popen([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", str(n), "--no-plots",
                             "--no-replan", "--backend", "ray", "--address", cluster, "--heartbeat-timeout", "3",
                             "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = None
    try:
        victim = worker_after_first_iteration(out, proc)
        stopped = time.monotonic()
        os.kill(victim["pid"], signal.SIGSTOP)
        hung = wait_for(lambda: [e for e in journal(out) if e.get("event") == "worker_hung"], 30, proc)
        assert hung[0]["gpu"] == "local-000:0" and 3.0 <= hung[0]["silent_s"] < 6.0
        assert time.monotonic() - stopped < 12.0
        assert proc.wait(180) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        if victim is not None:
            try:
                os.kill(victim["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    restarted = [w for w in json.loads((out / "workers.json").read_text()) if w["gpu"] == "local-000:0"]
    assert restarted[0]["incarnation"] == 1 and restarted[0]["pid"] != victim["pid"]
    check_exactly_once(out, n)


@pytest.mark.parametrize("case", ["format", "refused", "client", "local-backend", "map", "backend"])
def test_bad_backend_options_exit_2_with_one_line(tmp_path, capsys, case):
    plan, jobs = write_inputs(tmp_path / "in")
    base = [str(plan), "--jobs", str(jobs), "--out", str(tmp_path / "run")]
    args, needle = {
        "format": (["--backend", "ray", "--address", "head-node"], "--address: expected auto or HOST:PORT"),
        "refused": (["--backend", "ray", "--address", "127.0.0.1:1"],
                    "--address: no Ray cluster reachable at 127.0.0.1:1"),
        "client": (["--backend", "ray", "--address", "ray://head:10001"], "--address: Ray client addresses"),
        "local-backend": (["--address", "auto"], "--address: only with --backend ray"),
        "map": (["--backend", "ray", "--map", "local-000:0=cpu:0"], "--map: the ray backend assigns devices"),
        "backend": (["--backend", "k8s"], "--backend: expected local or ray, got 'k8s'"),
    }[case]
    started = time.monotonic()
    assert main(["run", *base, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert time.monotonic() - started < 10 and not (tmp_path / "run").exists()


def test_devices_per_ray_node():
    """Logical GPUs get explicit device indices per Ray node, in GPU-id order, whatever Ray node their
    topology node's placement group landed on."""
    from weave_rl.executor.ray_backend.cluster import NodePlacement, assign_devices

    ps = [NodePlacement("n-000", ["n-000:0", "n-000:1"], [], ray_node="R1"),
          NodePlacement("n-001", ["n-001:0", "n-001:1"], [], ray_node="R1"),
          NodePlacement("n-002", ["n-002:0", "n-002:1"], [], ray_node="R2"),
          NodePlacement("n-003", ["n-003:0", "n-003:1", "n-003:2"], [], ray_node="R3")]
    got = assign_devices(ps, {"R1": {"GPU": 4, "CPU": 32}, "R2": {"GPU": 8, "CPU": 32}, "R3": {"CPU": 2}})
    assert got == {"n-000:0": "cuda:0", "n-000:1": "cuda:1", "n-001:0": "cuda:2", "n-001:1": "cuda:3",
                   "n-002:0": "cuda:0", "n-002:1": "cuda:1", "n-003:0": "cpu:0", "n-003:1": "cpu:1",
                   "n-003:2": "cpu:0"}
    assert ps[1].devices == {"n-001:0": "cuda:2", "n-001:1": "cuda:3"}


def test_an_address_that_never_lets_us_join_fails_within_the_connect_timeout(tmp_path):
    """Something listens at the address (the TCP check passes) but it is no Ray head this machine can
    join: ``ray.init`` would retry for ever; ``weave run`` gives up after --connect-timeout, exit 2."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    threading.Thread(target=lambda: [listener.accept() for _ in range(64)], daemon=True).start()
    port = listener.getsockname()[1]
    plan, jobs = write_inputs(tmp_path / "in")
    started = time.monotonic()
    proc = subprocess.run([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--backend", "ray", "--address",
                           f"127.0.0.1:{port}", "--connect-timeout", "4", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    listener.close()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--address: the Ray cluster at 127.0.0.1:{port} did not let this machine join within 4 s" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 60
