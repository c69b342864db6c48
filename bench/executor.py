"""Local executor benchmark: the figures of issue 6, measured on worker processes of this machine.

Run from the repository root::

    .venv/bin/python -m bench.executor [--quick] [--iterations 20]

Sections (figures only; no timing asserts anywhere in the tests):

a. Warm-switch bandwidth: bytes/s of ``to_device`` + ``to_host`` of a job's train state (the
   ``bandit`` toy scaled to tens of MB, and the built-in ``grpo`` job when ``weave_rl.executor.rl`` imports)
   against a plain tensor copy of the same bytes, both ways, on the same device, one thread.
   Target >= 80%.
b. Permit latency: time from the controller's permit to the worker starting compute (p50 / p99 over
   every phase of a 2-job run of tiny phases). Target p99 <= 5 ms.
c. Miniature of Weave's micro-benchmark (a): two identical jobs whose rollout and train take about
   the same time. Solo-D gives each job its own rollout and train worker (4 workers); the
   co-scheduled plan (``make_plan``, optimal) puts both jobs on one rollout and one train worker,
   round-robin. Samples/s per worker, target >= 1.6x. This machine has two cores, so Solo-D is
   measured as one job alone on two dedicated workers (its other job is an identical copy on two
   other devices: the same samples/s per worker), not as four workers fighting over two cores.
   The two cores of this machine slow each other down when both are busy (measured and printed),
   which co-scheduling does by design: the printed ratio is what this machine gives.
d. Prediction: ``fit_jobs`` (what ``weave profile fit`` does) on the co-scheduled run's records,
   ``make_plan`` again at the median, run that plan, and compare each job's measured steady-state
   iteration with the plan's ``iteration_s``. Target within 10%.

Elastic rules (long-tail migration, lending) are off on the local backend.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

BENCH_TOPOLOGY = """name: bench-local
clusters:
  - name: local
    gpu_type: CPU
    nodes: 2
    gpus_per_node: 2
    host_mem_gb: 16
"""


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# ----- a. warm switch ---------------------------------------------------------------------------
def switch_bandwidth(workload, role: str, device: torch.device, repeats: int = 5) -> tuple[int, float, float]:
    """(bytes, switch bytes/s, plain copy bytes/s): both count the bytes moved there and back."""
    state = workload.initial_state(role)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    workload.to_device(role, state, device)  # first touch outside the timing
    state = workload.to_host(role)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        workload.to_device(role, state, device)
        state = workload.to_host(role)
        times.append(time.perf_counter() - t)
    pin = device.type == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    src.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    back = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    copies = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        dev.copy_(src, non_blocking=pin)
        back.copy_(dev, non_blocking=pin)
        if pin:
            torch.cuda.synchronize()
        copies.append(time.perf_counter() - t)
    copies = copies[1:]
    return nbytes, 2 * nbytes / statistics.median(times), 2 * nbytes / statistics.median(copies)


def section_a(device: str) -> None:
    """Measured in a spawned process that starts like a worker (one thread, the workers' malloc settings)."""
    import multiprocessing as mp

    from weave_rl.executor.local.backend import worker_env

    print("\na. warm-switch bandwidth (to_device + to_host of the train state vs plain copy, same bytes)")
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_section_a_child, args=(device,))
    with worker_env():
        proc.start()
    proc.join()


def _section_a_child(device_name: str) -> None:
    import weave_rl.executor.local.toy  # noqa: F401
    from weave_rl.executor.workload import build_workload

    torch.set_num_threads(1)
    device = torch.device(device_name)
    cases = [("bandit 1024x4096", build_workload("S", {"kind": "bandit", "features": 1024, "hidden": 4096},
                                                 default_seed=0))]
    try:
        cases.append(("grpo 384x4 layers", build_workload("G", {"kind": "grpo", "hidden_size": 384, "layers": 4},
                                                          default_seed=0)))
    except Exception as exc:  # noqa: BLE001  the built-in job may not be there yet
        print(f"   grpo: not measured ({type(exc).__name__}: {str(exc)[:80]})")
    out = []
    for name, wl in cases:
        nbytes, switch, plain = switch_bandwidth(wl, "train", device)
        ratio = switch / plain
        out.append((name, ratio))
        print(f"   {name:<24} {nbytes / 1e6:8.1f} MB  switch {switch / 1e9:6.2f} GB/s  plain copy "
              f"{plain / 1e9:6.2f} GB/s  -> {100 * ratio:5.1f}%  {verdict(ratio >= 0.8)} (target >= 80%)", flush=True)
    if device.type == "cpu":
        print("   (on CPU the grpo job's to_host hands back its live tensors: one copy, counted as two)")


# ----- helpers for the runs ---------------------------------------------------------------------
def jobs_file(folder: Path, names: list[str], block: str, rollout_s: float, train_s: float) -> Path:
    text = "jobs:\n"
    for n in names:
        text += f"""  - name: {n}
    params_b: 0.0001
    slo: 2.0
    rollout: {{gpus: 1, gpu_type: CPU, duration_s: {rollout_s:.4f}, host_mem_gb: 0.1}}
    train: {{gpus: 1, gpu_type: CPU, duration_s: {train_s:.4f}, host_mem_gb: 0.1}}
    workload: {block}
"""
    path = folder / f"jobs-{'-'.join(names)}.yaml"
    path.write_text(text)
    return path


def calibrate(options: dict) -> tuple[float, float]:
    """Median rollout(+reward) and train seconds of the bandit job in this process (one thread)."""
    import weave_rl.executor.local.toy  # noqa: F401
    from weave_rl.executor.local.comm import make_all_reduce
    from weave_rl.executor.workload import build_workload

    wl = build_workload("C", {"kind": "bandit", **options}, default_seed=0)
    cpu = torch.device("cpu")
    wl.to_device("rollout", wl.initial_state("rollout"), cpu)
    wl.to_device("train", wl.initial_state("train"), cpu)
    rs, ts = [], []
    for k in range(4):
        t = time.perf_counter()
        s = wl.reward(wl.rollout(k, 0, 1))
        rs.append(time.perf_counter() - t)
        t = time.perf_counter()
        wl.train(k, s, make_all_reduce(None, 1))
        ts.append(time.perf_counter() - t)
    return statistics.median(rs[1:]), statistics.median(ts[1:])


def run(plan, topo, jobs, out: Path, iterations: int, devices: dict[str, str] | None = None):
    from weave_rl.executor.local.devices import map_devices
    from weave_rl.executor.local.run import run_plan_local

    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    devices = devices or map_devices(gpus, None)
    return run_plan_local(plan, topo, jobs, out, iterations=iterations, devices=devices)


def per_worker_rate(result, batch: int) -> float:
    """Samples trained per second per worker over the steady state (second half of each job)."""
    frame = result.controller.records
    workers = len({g for grp in result.controller.plan.groups for jp in grp.jobs for s in jp.phases
                   for g in s.gpus})
    samples, spans = 0, []
    for job in {r["job"] for r in frame}:
        rows = sorted((r for r in frame if r["job"] == job and r["phase"] == "sync"), key=lambda r: r["iteration"])
        half = rows[len(rows) // 2:]
        if len(half) < 2:
            continue
        samples += (len(half) - 1) * batch
        spans.append((half[0]["end_s"], half[-1]["end_s"]))
    if not spans:
        return math.nan
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    return samples / window / workers


def steady(result, job: str) -> float:
    rows = sorted((r for r in result.controller.records if r["job"] == job and r["phase"] == "rollout"),
                  key=lambda r: r["iteration"])
    starts = [r["start_s"] - r["switch_s"] for r in rows]
    half = len(starts) // 2
    return (starts[-1] - starts[half]) / (len(starts) - 1 - half)


def _spin(core: int, seconds: float, queue) -> None:
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    t, n = time.perf_counter(), 0
    while time.perf_counter() - t < seconds:
        a @ a
        n += 1
    queue.put(n / seconds)


def core_interference(seconds: float = 2.0) -> tuple[float, float]:
    """Matmuls/s of one pinned process alone on cpu:0, and per process with cpu:0 and cpu:1 busy at once."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    rates = []
    for cores in ([0], [0, 1]):
        q = ctx.Queue()
        procs = [ctx.Process(target=_spin, args=(c % len(os.sched_getaffinity(0)), seconds, q)) for c in cores]
        for p in procs:
            p.start()
        got = [q.get() for _ in procs]
        for p in procs:
            p.join()
        rates.append(sum(got) / len(got))
    return rates[0], rates[1]


# ----- b, c, d ----------------------------------------------------------------------------------
def section_b(tmp: Path, iterations: int) -> dict:
    from weave_rl.planner.api import make_plan
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    print("\nb. permit latency (permit sent -> compute starts on the worker), tiny phases")
    topo = load_topology("local")
    jobs = load_jobs(jobs_file(tmp, ["A", "B"], "{kind: bandit, batch: 16, hidden: 32, steps: 1}", 0.01, 0.01))
    plan = make_plan(topo, jobs, policy="optimal", quantile=0.5, time_limit_s=10)
    res = run(plan, topo, jobs, tmp / "latency", iterations)
    lat = res.permit_latency
    print(f"   {lat['n']} phases: p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms  "
          f"{verdict(lat['p99_ms'] <= 5.0)} (target p99 <= 5 ms)")
    for phase, p in lat["by_phase"].items():
        print(f"     {phase:<8} {p['n']:4d} phases: p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, "
              f"max {p['max_ms']:.2f} ms")
    return lat


def section_cd(tmp: Path, iterations: int, options: dict) -> None:
    from weave_rl.executor.outputs import records_table
    from weave_rl.planner.api import make_plan
    from weave_rl.profiles.fit import fit_jobs
    from weave_rl.profiles.jobs import JobSet, load_jobs
    from weave_rl.topology.topology import load_topology

    (tmp / "bench-local.yaml").write_text(BENCH_TOPOLOGY)
    topo = load_topology(tmp / "bench-local.yaml")
    rollout_s, train_s = calibrate(options)
    # Balance the phases as in Weave's micro-benchmark (a): train epochs so that train ~ rollout.
    options = {**options, "epochs": max(1, round(options["epochs"] * rollout_s / train_s))}
    rollout_s, train_s = calibrate(options)
    block = "{" + ", ".join(f"{k}: {v}" for k, v in {"kind": "bandit", **options}.items()) + "}"
    batch = int(options["batch"])
    print(f"\nc. miniature micro-benchmark (a): two identical jobs, rollout {rollout_s:.3f} s, train {train_s:.3f} s "
          f"(calibrated in-process), {iterations} iterations")
    jobs = load_jobs(jobs_file(tmp, ["A", "B"], block, rollout_s, train_s))
    solo_plan = make_plan(topo, JobSet(jobs=[jobs["A"]]), policy="solo", quantile=0.5)
    co_plan = make_plan(topo, jobs, policy="optimal", quantile=0.5, time_limit_s=10)
    co_gpus = sorted({g for grp in co_plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    print(f"   co-scheduled plan: {len(co_gpus)} GPUs, cycle {co_plan.groups[0].cycle_s:.3f} s; "
          f"solo plan: cycle {solo_plan.groups[0].cycle_s:.3f} s")
    solo = run(solo_plan, topo, JobSet(jobs=[jobs["A"]]), tmp / "solo", iterations)
    co = run(co_plan, topo, jobs, tmp / "co", iterations)
    r_solo, r_co = per_worker_rate(solo, batch), per_worker_rate(co, batch)
    ratio = r_co / r_solo
    print(f"   Solo-D (each job: 1 rollout + 1 train worker): {r_solo:8.1f} samples/s per worker")
    print(f"   co-scheduled (2 jobs on 2 workers):           {r_co:8.1f} samples/s per worker")
    print(f"   -> {ratio:.2f}x  {verdict(ratio >= 1.6)} (target >= 1.6x; the paper's 1.82x is per $ on GPUs)")
    alone, both = core_interference()
    print(f"   this machine's devices are not independent: a 1-thread matmul loop runs {alone:.0f}/s alone on "
          f"cpu:0, {both:.0f}/s each on cpu:0 and cpu:1 at once ({100 * both / alone:.0f}%); co-scheduling keeps "
          f"both busy, Solo-D one at a time, so on independent devices the ratio would be about "
          f"{ratio * alone / both:.2f}x (an estimate, not a measurement)")

    print("\nd. measured iteration vs the plan's prediction after one profile fit")
    fitted = fit_jobs(records_table(co.controller), jobs)
    plan2 = make_plan(topo, fitted, policy="optimal", quantile=0.5, time_limit_s=10)
    again = run(plan2, topo, fitted, tmp / "refit", iterations)
    worst = 0.0
    for grp in plan2.groups:
        for jp in grp.jobs:
            measured = steady(again, jp.name)
            dev = measured / jp.iteration_s - 1
            worst = max(worst, abs(dev))
            print(f"   {jp.name}: plan {jp.iteration_s:.3f} s, measured steady {measured:.3f} s ({100 * dev:+.1f}%)")
    print(f"   worst deviation {100 * worst:.1f}%  {verdict(worst <= 0.10)} (target within 10%)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.executor", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, smaller phases")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sections", default="abcd")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    iterations = 8 if args.quick else args.iterations
    options = {"batch": 64, "hidden": 256, "steps": 1500 if args.quick else 3000, "epochs": 60 if args.quick else 120}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp:
        tmp = Path(tmp)
        if "a" in args.sections:
            section_a(args.device)
        if "b" in args.sections:
            section_b(tmp, max(20, iterations * 2))
        if "c" in args.sections or "d" in args.sections:
            section_cd(tmp, iterations, options)
    print(f"\nbench.executor done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
