"""Elastic-rules benchmark (issue 20): the plan's long-tail migration and lending on real worker
processes, against the same plan run ``--static``, on the long-tailed workload.

Run from the repository root::

    .venv/bin/python -m bench.elastic [--iterations 8] [--rounds 2]

Micro-benchmark (a) in small (paper digest 6.3: two jobs time-multiplex one rollout pool and one
train pool): a ``cpu-pools`` topology of a rollout node with two logical GPUs (one per core) and a
train node with one, two ``longtail`` jobs (responses ending at EOS, heavy-tailed lengths), planned by
the ``optimal`` planner into one group. Each round runs the same plan three ways, one after the other
in this process:

- ``static``: the plan's timetable only (``ElasticRules.off()``, what ``weave run --static`` does);
- ``migrate``: long-tail migration alone (threshold 0.8, target share 0.25; no lending);
- ``elastic``: the plan's rules, migration plus lending.

Then the simulator's prediction of the elastic run: the profiles and the sim's elastic model (tail
share, lending gain) refit from that run's records, the same plan simulated with them (as many
iterations, mean of 5 seeds), each job's steady iteration against the real one (target within
10 %); the same for the static run (profiles only), which tells the profile fit's share of a gap from
the elastic model's.

Throughput is generated tokens over the run's span (first rollout start to last sync end); the
figure of merit is each elastic mode's throughput over ``static``'s in the same round (the machine is
shared and noisy: ratios inside a round, never absolute times). Also printed: each job's steady
iteration (median spacing of iteration ends after the first), the elastic actions taken, the
prompt groups taken back and the compute thrown away with them.

Figures only; nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

# The train pool is its own GPU type (H800 vs H20 in the paper), so it is not lent to rollouts: on
# this 2-core machine its logical GPU shares a core with a rollout GPU, and a loan would only
# contend for that core.
TOPOLOGY = """name: cpu-pools
gpu_types:
  CPU-T: {tflops_bf16: 1.0, hbm_gb: 4, hbm_tbps: 0.05, usd_per_hour: 0.1}
clusters:
  - {name: rollout, gpu_type: CPU, nodes: 1, gpus_per_node: 2, host_mem_gb: 8}
  - {name: train, gpu_type: CPU-T, nodes: 1, gpus_per_node: 1, host_mem_gb: 8}
links:
  - {between: [rollout, train], gbps: 100}
"""

# One prompt group of 4 responses per share (8 shares on 2 GPUs); lengths lognormal (sigma 1.5) capped
# at 1024: a share takes 0.05-1.2 s on one core, a rollout about 3 s, a train step about 0.5-1.3 s
# (rollout-heavy, as the paper's jobs: T_roll 2.5-6 x T_train).
WORKLOAD = {"kind": "longtail", "prompts": 8, "group": 4, "mean_len": 64, "len_sigma": 1.5,
            "max_new_tokens": 1024, "hidden": 128, "step_repeat": 48}
MAP = {"rollout-000:0": "cpu:0", "rollout-000:1": "cpu:1", "train-000:0": "cpu:1"}


def build_inputs(folder: Path, rollout_s: float, train_s: float):
    """Topology, jobs and the optimal plan for them (profiles: the measured means of a probe run)."""
    import yaml

    from weave_rl.planner.api import make_plan
    from weave_rl.planner.check import require_valid
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    (folder / "topology.yaml").write_text(TOPOLOGY)
    jobs = [{"name": name, "params_b": 0.0001, "slo": 2.0,
             "rollout": {"gpus": 2, "gpu_type": "CPU", "duration_s": rollout_s, "host_mem_gb": 0.1},
             "train": {"gpus": 1, "gpu_type": "CPU-T", "duration_s": train_s, "host_mem_gb": 0.1},
             "workload": dict(WORKLOAD, seed=seed)} for name, seed in (("A", 11), ("B", 23))]
    (folder / "jobs.yaml").write_text(yaml.safe_dump({"jobs": jobs}, sort_keys=False))
    topo = load_topology(str(folder / "topology.yaml"))
    jobset = load_jobs(folder / "jobs.yaml", topo.gpu_types)
    plan = make_plan(topo, jobset, time_limit_s=20)
    require_valid(plan, topo, jobset, "<bench plan>")
    return plan, topo, jobset


def steady_iteration_s(records: list[dict]) -> dict[str, float]:
    """Per job: the mean spacing of its iterations' ends (sync ends), the first iteration left out
    (a mean, not a median: rollout lengths are heavy-tailed, and throughput is what the mean says)."""
    ends: dict[str, list[float]] = {}
    for r in records:
        if r["phase"] == "sync":
            ends.setdefault(r["job"], []).append(r["end_s"])
    return {j: (max(e) - min(e)) / (len(e) - 1) for j, e in ends.items() if len(e) > 1}


def predict(plan, topo, jobs, records: list[dict], iterations: int, rules, seeds: int = 5) -> dict[str, float]:
    """Refit the profiles and the sim's elastic model from a real run's records (what ``weave profile
    fit --elastic-out`` does), simulate the same plan with them under ``rules`` for as many iterations
    as the real run, and return each job's steady iteration averaged over ``seeds`` simulations."""
    import pandas as pd

    from weave_rl.executor.run import simulate_plan
    from weave_rl.executor.sim import SimModel
    from weave_rl.profiles.elastic_fit import ElasticParams, fit_elastic
    from weave_rl.profiles.fit import fit_jobs

    frame = pd.DataFrame(records)
    fitted = fit_jobs(frame, jobs, gpu_types=topo.gpu_types)
    fit = fit_elastic(frame)
    model = SimModel()
    if fit is not None:
        def params(values: dict) -> ElasticParams:
            return ElasticParams(**{k: v for k, v in values.items() if v is not None})

        base = params(fit.default)
        model = SimModel(tail_share=base.tail_share, tail_slowdown=base.tail_slowdown, lend_gain=base.lend_gain,
                         jobs={j: params(v) for j, v in fit.jobs.items()})
        print(f"  fitted elastic model: tail share {fit.default['tail_share']:.2f} "
              f"(A {fit.jobs['A']['tail_share']:.2f}, B {fit.jobs['B']['tail_share']:.2f}), "
              f"lending gain {fit.default['lend_gain']}")
    runs = [steady_iteration_s(simulate_plan(plan, topo, fitted, iterations=iterations, rules=rules, model=model,
                                             seed=seed).controller.records) for seed in range(seeds)]
    return {j: statistics.mean(r[j] for r in runs) for j in runs[0]}


def run_once(plan, topo, jobs, out: Path, iterations: int, rules) -> dict:
    from weave_rl.executor.local.run import run_plan_local

    result = run_plan_local(plan, topo, jobs, out, iterations=iterations, devices=MAP, rules=rules)
    records = result.records
    rollouts = [r for r in records if r["phase"] == "rollout"]
    tokens = sum(float(r["tokens"]) for r in rollouts)
    span = max(r["end_s"] for r in records) - min(r["start_s"] for r in records)
    steady = steady_iteration_s(records)
    return {"tokens_per_s": tokens / span, "span_s": span, "steady_s": steady, "records": records,
            "actions": dict(result.controller.elastic_counts),
            "taken_back": sum(int(r.get("shares_taken_back", 0) or 0) for r in rollouts),
            "wasted_gpu_s": sum(float(r.get("wasted_gpu_s", 0.0) or 0.0) for r in rollouts),
            "tail_share": statistics.median(float(r["tail_share"]) for r in rollouts) if "tail_share" in rollouts[0]
            else float("nan"),
            "rollout_s": statistics.median(r["duration_s"] for r in rollouts),
            "train_s": statistics.median(r["duration_s"] for r in records if r["phase"] == "train")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    from weave_rl.executor.config import ElasticRules

    modes = {"static": ElasticRules.off(), "migrate": ElasticRules(migrate=True, lend=False), "elastic": None}
    with tempfile.TemporaryDirectory(prefix="weave-bench-elastic-") as tmp:
        root = Path(tmp)
        # Profiles from a short static probe, so the plan's durations are this machine's.
        plan, topo, jobs = build_inputs(root, 1.0, 0.2)
        probe = run_once(plan, topo, jobs, root / "probe", 3, ElasticRules.off())
        plan, topo, jobs = build_inputs(root, probe["rollout_s"], probe["train_s"])
        print(f"plan: {len(plan.groups)} group(s), cycle {plan.groups[0].cycle_s:.2f} s; probe rollout "
              f"{probe['rollout_s']:.2f} s, train {probe['train_s']:.2f} s; elastic block {dict(plan.elastic)}")
        ratios: dict[str, list[float]] = {"migrate": [], "elastic": []}
        for rnd in range(args.rounds):
            got = {}
            for name, rules in modes.items():
                got[name] = run_once(plan, topo, jobs, root / f"r{rnd}-{name}", args.iterations, rules)
                g = got[name]
                steady = ", ".join(f"{j} {s:.2f} s" for j, s in sorted(g["steady_s"].items()))
                print(f"round {rnd} {name:8s} {g['tokens_per_s']:8.0f} tokens/s  span {g['span_s']:6.2f} s  "
                      f"steady {steady}  actions {g['actions']}  groups taken back {g['taken_back']} "
                      f"(wasted {g['wasted_gpu_s']:.2f} GPU-s)  median tail share {g['tail_share']:.2f}")
            for name in ratios:
                ratios[name].append(got[name]["tokens_per_s"] / got["static"]["tokens_per_s"])
            plan_rules = ElasticRules.from_plan(plan.elastic)
            for name, rules in (("static", ElasticRules.off()), ("elastic", plan_rules)):
                real = got[name]["steady_s"]
                sim = predict(plan, topo, jobs, got[name]["records"], args.iterations, rules)
                print(f"round {rnd} simulator refit from the {name} run, against it: " + ", ".join(
                    f"{j} real {real[j]:.2f} s sim {sim[j]:.2f} s ({100 * (sim[j] / real[j] - 1):+.1f}%)"
                    for j in sorted(real)) + " (target within 10%)")
        for name, values in ratios.items():
            print(f"{name} / static throughput: " + " ".join(f"{v:.3f}x" for v in values)
                  + f"  (median {statistics.median(values):.3f}x; floor for migration alone: 1.10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
