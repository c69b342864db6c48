"""Own-job benchmark (issue 21): a jobs file of the user's own jobs, co-scheduled by an ``optimal`` plan on
this machine's ``local`` topology and run on real worker processes.

Run from the repository root (in the vLLM venv for the vLLM figures of b)::

    .venv/bin/python -m bench.own_job [--jobs examples/smollm2_grpo/jobs.yaml] [--iterations 30]

By default the jobs are ``examples/smollm2_grpo``: SmolLM2-135M-Instruct learning by GRPO to name the
larger number of a word problem, sharing the two devices with a small second job. The folder of the
jobs file goes on the workers' ``PYTHONPATH`` (a ``kind: my_module:MyWorkload`` there imports), so
``--jobs examples/custom_job/jobs.yaml`` runs the custom-job example the same way.

a. reward curve: each job's mean training reward over the first and last 10 iterations; for a grpo job
   on a dataset, with a ``heldout.jsonl`` next to the jobs file, also the mean reward of its greedy answers to those
   problems by the initial policy and by the last checkpoint's;
b. rollout tokens/s of each grpo job in the run (torch engine), and of the same job's options on the
   torch and the vLLM engine in this process (3 rollouts each after a warm-up; vLLM when installed);
c. warm switch: ``to_device`` + ``to_host`` of each job's train state against a plain copy of the same
   bytes there and back (one thread, in this process);
d. iteration time against the plan after one ``profile fit``: fit the records of run (a), plan again
   at the median, run that plan ``--static`` (the plan's timetable is static; the elastic rules only
   speed it up), and compare each job's steady iteration with the plan's ``iteration_s`` (target
   within 10 %), with the sync time the fit added beyond the network model (``sync_overhead_s``).

Figures only; nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.executor import steady, switch_bandwidth, verdict

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JOBS = ROOT / "examples" / "smollm2_grpo" / "jobs.yaml"


def run(plan, topo, jobs, out: Path, iterations: int, static: bool = False):
    from weave_rl.executor.config import ElasticRules
    from weave_rl.executor.local.devices import map_devices
    from weave_rl.executor.local.run import run_plan_local

    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    return run_plan_local(plan, topo, jobs, out, iterations=iterations, devices=map_devices(gpus, None),
                          rules=ElasticRules.off() if static else None)


def engine_tokens_per_s(block: dict, engine: str, rollouts: int = 3) -> str:
    """Tokens/s of ``rollouts`` rollouts of a grpo job's options on ``engine``, here, after a warm-up."""
    from weave_rl.executor.workload import build_workload

    if engine == "vllm":
        from weave_rl.executor.rl.vllm_engine import vllm_missing

        if vllm_missing():
            return "not installed in this venv (run the bench with .venv-vllm/bin/python)"
    job = build_workload("probe", {**block, "engine": engine})
    job.to_device("rollout", job.initial_state("rollout"), torch.device("cpu"))
    try:
        job.rollout(0, 0, 1)  # warm-up: first-call allocations, the engine's first batch
        tokens, start = 0, time.perf_counter()
        for k in range(1, rollouts + 1):
            tokens += job.rollout(k, 0, 1).tokens
        seconds = time.perf_counter() - start
    finally:
        if job.rollout_engine is not None:
            job.rollout_engine.close()
    return f"{tokens / seconds:,.0f} tokens/s ({tokens:,} tokens in {seconds:.2f} s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=Path, default=DEFAULT_JOBS)
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args(argv)
    folder = args.jobs.resolve().parent
    # The workers are spawned: they get this sys.path and environment, and import the user's kinds themselves.
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH", "")]))
    from weave_rl.executor.inputs import load_run_inputs
    from weave_rl.executor.outputs import records_table
    from weave_rl.executor.rl.data import load_problems
    from weave_rl.executor.rl.evaluate import greedy_score
    from weave_rl.executor.workload import build_workload, split_block
    from weave_rl.planner.api import make_plan
    from weave_rl.planner.plan import save_plan
    from weave_rl.profiles.fit import fit_jobs
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    topo = load_topology("local")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="weave-own-job-") as tmp_name:
        tmp = Path(tmp_name)
        draft = load_jobs(args.jobs, topo.gpu_types)
        plan = make_plan(topo, draft, policy="optimal", quantile=0.5, time_limit_s=10)
        save_plan(plan, tmp / "plan.yaml")
        plan, topo, jobs = load_run_inputs(tmp / "plan.yaml", args.jobs, None)  # what weave run checks
        names = [jp.name for grp in plan.groups for jp in grp.jobs]
        grpo = [n for n in names if split_block(jobs[n].workload, 0)[0] == "grpo"]
        print(f"{len(names)} jobs of {args.jobs} ({', '.join(names)}; rejected: "
              f"{', '.join(r.name for r in plan.rejected) or 'none'}), optimal plan on local: "
              f"{len(plan.groups)} group(s), cycle {plan.groups[0].cycle_s:.2f} s; {args.iterations} iterations")
        started = time.perf_counter()
        first = run(plan, topo, jobs, tmp / "run", args.iterations)
        print(f"   ran in {time.perf_counter() - started:.0f} s")
        frame = records_table(first.controller)

        edge = min(10, args.iterations // 2)
        print(f"\na. reward curve (mean training reward, first {edge} / last {edge} iterations)")
        for job in names:
            rows = sorted((r for r in first.job_rows if r["job"] == job), key=lambda r: r["iteration"])
            rewards = [r.get("reward_mean", r.get("mean_reward")) for r in rows]
            head, tail = sum(rewards[:edge]) / edge, sum(rewards[-edge:]) / edge
            print(f"   {job}: {head:.3f} -> {tail:.3f} ({tail - head:+.3f})  {verdict(tail > head)}")
        heldout = folder / "heldout.jsonl"
        for job in [n for n in grpo if jobs[n].workload.get("dataset")] if heldout.is_file() else []:
            wl = build_workload(job, jobs[job].workload)
            problems = load_problems(str(heldout), wl.opts.prompt_field, wl.opts.answer_field)
            last = tmp / "run" / "checkpoints" / job / f"policy-{args.iterations - 1}.pt"
            before = greedy_score(wl, problems)
            after = greedy_score(wl, problems, torch.load(last, weights_only=True))
            print(f"   {job}: greedy answers to {len(problems)} held-out problems {before:.3f} -> {after:.3f} "
                  f"({after - before:+.3f})  {verdict(after > before)}")

        print("\nb. rollout tokens/s")
        for job in names:
            rows = frame[(frame.job == job) & (frame.phase == "rollout")]
            print(f"   {job} in the run (torch, elastic): {rows.tokens.sum() / rows.duration_s.sum():,.0f} tokens/s "
                  f"({int(rows.tokens.sum()):,} tokens in {rows.duration_s.sum():.2f} s of rollout)")
        for job in grpo:
            for engine in ("torch", "vllm"):
                print(f"   {job} here, {engine}: {engine_tokens_per_s(jobs[job].workload, engine)}")

        print("\nc. warm switch of the train state (to_device + to_host) vs a plain copy of the same bytes")
        for job in names:
            wl = build_workload(job, jobs[job].workload)
            nbytes, switch, copy = switch_bandwidth(wl, "train", torch.device("cpu"))
            print(f"   {job}: {nbytes / 1e6:.1f} MB, switch {switch / 1e9:.2f} GB/s, plain copy {copy / 1e9:.2f} GB/s "
                  f"({100 * switch / copy:.0f}%)")

        print("\nd. measured iteration vs the plan after one profile fit (the refit plan run --static)")
        fitted = fit_jobs(frame, jobs)
        plan2 = make_plan(topo, fitted, policy="optimal", quantile=0.5, time_limit_s=10)
        again = run(plan2, topo, fitted, tmp / "refit", max(10, args.iterations // 2), static=True)
        worst = 0.0
        for grp in plan2.groups:
            for jp in grp.jobs:
                measured = steady(again, jp.name)
                dev = measured / jp.iteration_s - 1
                worst = max(worst, abs(dev))
                sync = sum(ph.duration_s for ph in jp.phases if ph.phase == "sync")
                print(f"   {jp.name}: plan {jp.iteration_s:.2f} s, measured steady {measured:.2f} s ({100 * dev:+.1f}%); "
                      f"sync planned {sync:.2f} s, of which {fitted[jp.name].sync_overhead_s:.2f} s measured beyond "
                      f"the network model")
        for r in plan2.rejected:
            print(f"   {r.name}: rejected by the refit plan ({r.reason})")
        print(f"   worst deviation {100 * worst:.1f}%  {verdict(worst <= 0.10)} (target within 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
