"""Prometheus metrics of a run: scraped over HTTP during and after a simulation of a committed plan."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from weave_rl.executor.config import ElasticRules
from weave_rl.executor.faults import parse_faults
from weave_rl.executor.monitoring import ControllerMonitor, reason_kind, start_metrics_server
from weave_rl.executor.outputs import metrics
from weave_rl.executor.run import simulate_plan
from weave_rl.executor.sim import SimModel
from weave_rl.executor.trace import BaselinePlanner, run_trace
from weave_rl.planner.plan import load_plan
from weave_rl.profiles.jobs import JobSet, load_jobs
from weave_rl.topology.topology import load_topology

from example_plans import EXAMPLES, PLANS
from test_sim import job, topo

FAMILIES = ("weave_phase_duration_seconds", "weave_switch_seconds", "weave_sync_seconds", "weave_queue_depth",
            "weave_pool_idle_ratio", "weave_pool_busy_gpu_seconds", "weave_gpus_held", "weave_usd_per_hour",
            "weave_replans", "weave_worker_restarts", "weave_node_failures", "weave_iterations",
            "weave_sim_time_seconds")


def scrape(url: str) -> dict[str, list]:
    """Family name -> its samples (name, labels, value)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def value(families: dict, sample: str, **labels) -> float:
    """Sum of the samples named ``sample`` whose labels include ``labels``."""
    return sum(v for samples in families.values() for name, lab, v in samples
               if name == sample and all(lab.get(k) == x for k, x in labels.items()))


def micro_a():
    topo_file, jobs_file = EXAMPLES["micro-a.yaml"]
    t = load_topology(str(topo_file))
    return load_plan(PLANS / "micro-a.yaml"), t, load_jobs(jobs_file, t.gpu_types)


def test_metrics_of_a_static_run_with_a_fault():
    plan, t, jobs = micro_a()
    servers, during = [], []

    def setup(controller, _backend):
        monitor = ControllerMonitor(controller, state_every_s=0.0)  # refresh the gauges on every record
        servers.append(start_metrics_server(monitor, 0))
        # Scrape from inside the run, once, after the first completed iteration.
        controller.on_iteration.append(lambda j, k, _t: during.append(scrape(servers[0].url)) if not during else None)

    result = simulate_plan(plan, t, jobs, iterations=6, rules=ElasticRules.off(),
                           faults=parse_faults("train-000@150+60", t), setup=setup)
    server = servers[0]
    try:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics" and server.port > 0
        after = scrape(server.url)
    finally:
        server.close()
    records = result.records
    assert set(FAMILIES) <= set(after)

    # Every record is one phase-duration observation: 2 jobs x 6 iterations x 3 phases, plus A1's rollout
    # that train-000 going down at 150 s aborted after it had finished (it is run again).
    assert len(records) == 37
    assert value(after, "weave_phase_duration_seconds_count") == 37
    assert value(after, "weave_phase_duration_seconds_count", job="A1", phase="rollout") == 7
    assert value(after, "weave_phase_duration_seconds_count", job="A2", phase="train") == 6
    assert value(after, "weave_phase_duration_seconds_sum", job="A2", phase="rollout") == pytest.approx(
        sum(r["duration_s"] for r in records if r["job"] == "A2" and r["phase"] == "rollout"))
    # micro-a's rollout takes 140 s on its 8 H20s (static run, no noise): all 13 in the 180 s bucket, none in 120.
    assert value(after, "weave_phase_duration_seconds_bucket", phase="rollout", le="120.0") == 0
    assert value(after, "weave_phase_duration_seconds_bucket", phase="rollout", le="180.0") == 13
    assert value(after, "weave_sync_seconds_count") == 12
    assert value(after, "weave_sync_seconds_sum", job="A1") == pytest.approx(
        sum(r["duration_s"] for r in records if r["job"] == "A1" and r["phase"] == "sync"))
    switches = [r for r in records if r["phase"] != "sync" and r["switch_s"] > 0]
    assert value(after, "weave_switch_seconds_count") == len(switches) > 0
    assert value(after, "weave_switch_seconds_sum") == pytest.approx(sum(r["switch_s"] for r in switches))

    assert value(after, "weave_worker_restarts_total", job="A1") == 1
    assert value(after, "weave_node_failures_total", node="train-000") == 1
    assert value(after, "weave_iterations_total", job="A1") == value(after, "weave_iterations_total", job="A2") == 6
    assert value(after, "weave_sim_time_seconds") == pytest.approx(result.horizon_s)

    # At the end the idle ratio is metrics.json's bubble share, per cluster.
    m = metrics(result.controller, wall_s=result.wall_s, events=result.events)
    for cluster in ("rollout", "train"):
        assert value(after, "weave_pool_idle_ratio", cluster=cluster) == pytest.approx(
            m["clusters"][cluster]["bubble_share"], rel=1e-9)
    busy = sum(r["busy_gpu_s"] for r in records if r["cluster"] == "rollout")
    assert value(after, "weave_pool_busy_gpu_seconds_total", cluster="rollout", role="rollout") == pytest.approx(busy)
    # Both jobs finished: nothing is queued or held any more.
    assert value(after, "weave_queue_depth", node="rollout-000") == 0
    assert value(after, "weave_usd_per_hour") == 0

    # During the run (after A's first iteration): fewer observations than records at the end, the plan's
    # two node pairs held at micro-a's price (8 x 1.85 + 8 x 5.28 $/h), and phases waiting in the queues.
    mid = during[0]
    assert 0 < value(mid, "weave_phase_duration_seconds_count") < 37
    assert value(mid, "weave_usd_per_hour") == pytest.approx(57.04)
    assert value(mid, "weave_gpus_held", cluster="rollout") == 8
    assert value(mid, "weave_queue_depth") >= 1


def test_replans_are_counted_by_reason_in_a_trace():
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=2), job("J2", iterations=2, arrival_s=1000.0)])
    monitors = []
    result = run_trace(t, jobs, BaselinePlanner(t, "solo"), rules=ElasticRules.off(),
                       model=SimModel(link_sharing=False),
                       setup=lambda c, _b: monitors.append(ControllerMonitor(c)))
    server = start_metrics_server(monitors[0], 0)
    try:
        after = scrape(server.url)
    finally:
        server.close()
    plan_events = [e for e in result.controller.events if e["event"] in ("switch", "admit")]
    kinds = sorted({reason_kind(e["reason"]) for e in plan_events})
    assert kinds and set(kinds) <= {"admit", "release"}
    for kind in kinds:
        expected = sum(1 for e in plan_events if reason_kind(e["reason"]) == kind)
        assert value(after, "weave_replans_total", reason=kind) == expected
    assert value(after, "weave_replans_total") == len(plan_events)
    assert value(after, "weave_phase_duration_seconds_count") == len(result.records) == 2 * 2 * 3


def test_registries_are_separate_and_reasons_are_short():
    plan, t, jobs = micro_a()
    a = simulate_plan(plan, t, jobs, iterations=2, rules=ElasticRules.off())
    b = simulate_plan(plan, t, jobs, iterations=3, rules=ElasticRules.off())
    # Attached after the run: the monitor replays the records so far.
    ma, mb = ControllerMonitor(a.controller), ControllerMonitor(b.controller)
    count = "weave_phase_duration_seconds_count"
    assert ma.registry.get_sample_value(count, {"job": "A1", "phase": "train"}) == 2
    assert mb.registry.get_sample_value(count, {"job": "A1", "phase": "train"}) == 3
    assert reason_kind("drift: A1 rollout at 1.52x of its profile for 5 iterations") == "drift"
    assert reason_kind("admit J3") == "admit" and reason_kind("re-optimize") == "re-optimize"
    assert reason_kind("") == "replan"


def test_simulate_metrics_port_serves_and_a_taken_port_is_one_line_exit_2(tmp_path, capsys):
    import socket

    from weave_rl.cli.app import main

    topo_file, jobs_file = EXAMPLES["micro-a.yaml"]
    args = ["simulate", str(PLANS / "micro-a.yaml"), "--jobs", str(jobs_file), "--topology", str(topo_file),
            "--iterations", "2", "--no-plots", "--json", "--out", str(tmp_path / "run")]
    assert main([*args, "--metrics-port", "0", "--metrics-linger", "0"]) == 0
    err = capsys.readouterr().err
    assert "metrics on http://127.0.0.1:" in err and "metrics stay on" not in err  # 0: closed with the run
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([*args, "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--metrics-port: cannot serve on 127.0.0.1:{port}" in err and "\n" not in err


def test_state_gauges_are_current_at_scrape_time():
    """The controller's own refresh is off (state_every_s huge): a scrape mid-run must still show the
    clock, the GPUs held and the queues of that moment, not the zeros of the monitor's start."""
    plan, t, jobs = micro_a()
    seen = []

    def setup(controller, _backend):
        monitor = ControllerMonitor(controller, state_every_s=1e9)
        server = start_metrics_server(monitor, 0)

        def on_iteration(job, k, _t):
            if job == "A1" and k == 2 and not seen:
                seen.append((controller.now, scrape(server.url)))
                server.close()
        controller.on_iteration.append(on_iteration)

    simulate_plan(plan, t, jobs, iterations=4, rules=ElasticRules.off(), setup=setup)
    now, families = seen[0]
    assert now > 0
    assert value(families, "weave_sim_time_seconds") == pytest.approx(now)
    assert value(families, "weave_gpus_held", cluster="rollout") == 8  # micro-a: 8 H20 + 8 H800 held
    assert value(families, "weave_gpus_held", cluster="train") == 8
    assert value(families, "weave_iterations_total", job="A1") == 3  # iterations 0, 1, 2 of A1 done
    assert 0 < value(families, "weave_pool_idle_ratio", cluster="train") < 1


def test_linger_waits_for_one_scrape_of_the_final_values_or_the_time():
    import threading
    import time

    plan, t, jobs = micro_a()
    servers = []
    result = simulate_plan(plan, t, jobs, iterations=3, rules=ElasticRules.off(),
                           setup=lambda c, _b: servers.append(start_metrics_server(c, 0)))
    server = servers[0]
    try:
        assert server.linger(0.3, until_scraped=True) == pytest.approx(0.3, abs=0.25)  # nobody scrapes: the time
        waited, got = [], []
        thread = threading.Thread(target=lambda: waited.append(server.linger(30)))
        thread.start()
        time.sleep(0.3)
        got.append(scrape(server.url))
        thread.join(timeout=10)
        assert waited and waited[0] < 5  # ended by the scrape, not by the 30 s
        final = got[0]
        assert value(final, "weave_sim_time_seconds") == pytest.approx(result.controller.now)
        assert value(final, "weave_iterations_total", job="A1") == 3
        assert value(final, "weave_phase_duration_seconds_count") == len(result.controller.records)
    finally:
        server.close()


def test_linger_is_not_ended_by_a_scrape_that_began_before_the_final_values():
    # A scrape in flight when the run ends counts after the final refresh, but read the values of
    # before it: the linger waits for the next one (here: none, so the time).
    import threading

    plan, t, jobs = micro_a()
    servers = []
    simulate_plan(plan, t, jobs, iterations=3, rules=ElasticRules.off(),
                  setup=lambda c, _b: servers.append(start_metrics_server(c, 0)))
    server = servers[0]
    try:
        monitor = server.monitor
        monitor.last_scrape_began = -1.0  # began long before the linger
        threading.Timer(0.1, lambda: setattr(monitor, "scrapes", monitor.scrapes + 1)).start()
        assert server.linger(0.6) >= 0.6 - 1e-3
    finally:
        server.close()


def test_simulate_metrics_linger_keeps_the_endpoint_until_scraped(tmp_path):
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    topo_file, jobs_file = EXAMPLES["micro-a.yaml"]
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "weave_rl.cli.app", "simulate", str(PLANS / "micro-a.yaml"),
                             "--jobs", str(jobs_file), "--topology", str(topo_file), "--iterations", "5",
                             "--no-plots", "--out", str(tmp_path / "run"), "--metrics-port", str(port),
                             "--metrics-linger", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last = None
    try:
        while proc.poll() is None and time.monotonic() - start < 120:
            try:
                last = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                pass
            time.sleep(0.2)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "metrics stay on" in err and "--metrics-linger" in err
    assert time.monotonic() - start < 50  # ended by our scrape after the run, not by the 60 s
    # the last scrape read the final values: all 5 iterations of both jobs
    assert value(last, "weave_iterations_total", job="A1") == 5 and value(last, "weave_iterations_total", job="A2") == 5
