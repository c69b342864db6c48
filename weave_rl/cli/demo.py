"""The main job on the embedded example: the Weave testbed, a 20-job Mixed workload, plans by every
policy, the optimal plan checked, drawn and simulated; then a short real run: two GRPO jobs planned on
this machine's ``local`` topology, simulated, executed on local worker processes, and the loop closed
the way users work: the profiles fit from the run's own records, the plan re-solved on them, and
planned, measured and replanned iteration times side by side."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from weave_rl.planner.api import make_plan
from weave_rl.planner.check import check_plan, format_violations
from weave_rl.planner.plan import save_plan
from weave_rl.planner.summary import cluster_use
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import save_jobs
from weave_rl.topology.topology import load_topology
from weave_rl.cli.render import table


# Two small real jobs for the local run: the built-in GRPO job on two tasks of about the same cost per
# iteration (so that sharing the two workers keeps both within their SLO). Their profiles are rough
# figures for one CPU core; the run measures the real ones and the demo refits them.
LOCAL_JOBS = """jobs:
  - name: add
    params_b: 0.0001
    slo: 2.0
    rollout: {gpus: 1, gpu_type: CPU, duration_s: 0.15, host_mem_gb: 0.1}
    train: {gpus: 1, gpu_type: CPU, duration_s: 0.15, host_mem_gb: 0.1}
    workload: {kind: grpo, task: addition, seed: 1}
  - name: sort
    params_b: 0.0001
    slo: 2.0
    rollout: {gpus: 1, gpu_type: CPU, duration_s: 0.15, host_mem_gb: 0.1}
    train: {gpus: 1, gpu_type: CPU, duration_s: 0.15, host_mem_gb: 0.1}
    workload: {kind: grpo, task: sort, digits: 6, seed: 2}
"""


def run_demo(out: Path, console: Console, *, jobs: int = 20, seed: int = 1, time_limit_s: float = 60.0,
             real_iterations: int = 20) -> int:
    out.mkdir(parents=True, exist_ok=True)
    topo = load_topology("weave-testbed")
    console.print(f"[bold]1. Topology[/] {topo.name}: {topo.total_gpus} GPUs in {len(topo.nodes)} nodes, "
                  f"${topo.cost_usd_per_hour():,.2f}/h if all held; cross-cluster link "
                  f"{topo.bottleneck_gbps(['train-000'], ['rollout-000']):g} Gbit/s")
    workload = generate("Mixed", jobs, seed)
    jobs_path = out / "jobs.yaml"
    save_jobs(workload, jobs_path)
    console.print(f"[bold]2. Workload[/] {jobs} Mixed jobs (seed {seed}) -> {jobs_path}")
    rows, plans = [], {}
    for policy in ("solo", "colocate", "weave", "optimal"):
        plan = make_plan(topo, workload, policy=policy, time_limit_s=time_limit_s)
        violations = check_plan(plan, topo, workload)
        if violations:
            console.print(f"[red]{policy} plan fails the checker:[/]\n{format_violations(violations)}")
            return 1
        plans[policy] = plan
        save_plan(plan, out / f"plan-{policy}.yaml")
        use = {u.cluster: u for u in cluster_use(plan, topo)}
        rows.append([policy, plan.cost_usd_per_hour, plan.lower_bound_usd_per_hour, len(plan.groups),
                     sum(u.gpus for u in use.values()),
                     " ".join(f"{c}:{100 * u.busy_share:.0f}%" for c, u in use.items()),
                     f"{plan.solver.wall_s:.2f}"])
    console.print("[bold]3. Plans[/] (all pass the independent checker)")
    console.print(table("Policies", ["policy", "$/h", "lower bound", "groups", "GPUs", "busy", "wall s"], rows))
    best = plans["optimal"]
    for other in ("solo", "colocate", "weave"):
        ratio = plans[other].cost_usd_per_hour / best.cost_usd_per_hour
        console.print(f"optimal is {ratio:.2f}x cheaper than {other}")
    from weave_rl.planner.gantt import gantt_html, gantt_png

    png = gantt_png(best, out / "plan-optimal.png")
    html = gantt_html(best, out / "plan-optimal.html")
    console.print(f"[bold]4. Pictures[/] {png}, {html}")
    simulate(best, topo, workload, out / "sim", console)
    if real_iterations > 0:
        return real_run(out / "local", console, iterations=real_iterations, time_limit_s=time_limit_s)
    return 0


def simulate(plan, topo, workload, out: Path, console: Console, iterations: int = 10) -> None:
    """The optimal plan on the sim backend: sampled phase times, shared links, the elastic rules."""
    from weave_rl.executor.config import ElasticRules
    from weave_rl.executor.outputs import metrics, write_outputs
    from weave_rl.executor.run import simulate_plan

    result = simulate_plan(plan, topo, workload, iterations=iterations, rules=ElasticRules.from_plan(plan.elastic))
    data = metrics(result.controller, wall_s=result.wall_s, events=result.events)
    write_outputs(out, result.controller, data)
    ratios = [j["steady_iteration_s"] / j["planned_iteration_s"] for j in data["per_job"].values()
              if j["planned_iteration_s"] > 0 and j["steady_iteration_s"] == j["steady_iteration_s"]]
    console.print(f"[bold]5. Simulation[/] {iterations} iterations of every job in {result.wall_s:.2f} s "
                  f"({data['events']:,} events, durations sampled, syncs sharing the inter-cluster link): "
                  f"${data['peak_usd_per_hour']:,.2f}/h while every job runs, SLO attainment "
                  f"{100 * data['slo_attainment']:.1f}%, steady iteration / planned (at the 0.95 quantile) "
                  f"{min(ratios):.2f}-{max(ratios):.2f} -> {out}")


def real_run(out: Path, console: Console, *, iterations: int, time_limit_s: float) -> int:
    """Two GRPO jobs planned on this machine and run on local worker processes (one per core)."""
    from weave_rl.executor.local.devices import map_devices
    from weave_rl.executor.local.run import run_plan_local
    from weave_rl.executor.run import simulate_plan
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.cli.run import write_run_outputs

    out.mkdir(parents=True, exist_ok=True)
    topo = load_topology("local")
    jobs_path = out / "jobs.yaml"
    jobs_path.write_text(LOCAL_JOBS)
    local_jobs = load_jobs(jobs_path, topo.gpu_types)
    plan = make_plan(topo, local_jobs, policy="optimal", quantile=0.5, time_limit_s=min(10.0, time_limit_s))
    violations = check_plan(plan, topo, local_jobs)
    if violations:
        console.print(f"[red]local plan fails the checker:[/]\n{format_violations(violations)}")
        return 1
    save_plan(plan, out / "plan.yaml")
    predicted = simulate_plan(plan, topo, local_jobs, iterations=iterations).controller
    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    console.print(f"[bold]6. Real run[/] {len(local_jobs)} GRPO jobs on {topo.name} ({len(gpus)} workers), "
                  f"{len(plan.groups)} group(s); {iterations} iterations each on local worker processes ...")
    result = run_plan_local(plan, topo, local_jobs, out / "run", iterations=iterations,
                            devices=map_devices(gpus, None))
    data = write_run_outputs(out / "run", result, plots=True, inputs={
        "plan": str(out / "plan.yaml"), "jobs": str(jobs_path), "topology": topo.name, "iterations": iterations})
    # Close the loop: refit the profiles from this run's records and replan on them.
    from weave_rl.planner.online import replan
    from weave_rl.profiles.fit import fit_jobs
    from weave_rl.profiles.records import read_records

    records = out / "run" / "records.parquet"
    frame = read_records(records)
    fitted = fit_jobs(frame, local_jobs, records_file=str(records), gpu_types=topo.gpu_types)
    tail = after_train(frame)
    fitted_path = out / "jobs-fitted.yaml"
    save_jobs(fitted, fitted_path)
    new_plan = replan(plan, fitted, topo, time_limit_s=min(10.0, time_limit_s)).plan
    violations = check_plan(new_plan, topo, fitted)
    if violations:
        console.print(f"[red]replanned local plan fails the checker:[/]\n{format_violations(violations)}")
        return 1
    save_plan(new_plan, out / "plan-replanned.yaml")
    replanned = {j.name: j for g in new_plan.groups for j in g.jobs}
    rejected = {r.name: r.reason for r in new_plan.rejected}
    rows = []
    for jp in (j for g in plan.groups for j in g.jobs):
        rewards = [r["reward_mean"] for r in result.job_rows if r["job"] == jp.name and "reward_mean" in r]
        head, last = rewards[:3], rewards[-3:]
        measured = data["per_job"][jp.name]["steady_iteration_s"]
        simulated = predicted.state[jp.name]
        sim_steady = ((simulated.rollout_starts[max(simulated.rollout_starts)] - simulated.rollout_starts[0])
                      / max(1, len(simulated.rollout_starts) - 1))
        again = replanned.get(jp.name)
        planned_sync = sum(ph.duration_s for ph in (again or jp).phases if ph.phase == "sync")
        rows.append([jp.name, f"{jp.iteration_s:.3f}", f"{sim_steady:.3f}", f"{measured:.3f}",
                     f"{again.iteration_s:.3f}" if again else f"rejected: {rejected.get(jp.name, '?')}",
                     f"{measured / jp.iteration_s:.2f}x / {measured / again.iteration_s:.2f}x" if again else "-",
                     f"{tail.get(jp.name, float('nan')):.3f} / {planned_sync:.3f}",
                     f"{sum(head) / max(1, len(head)):.3f}", f"{sum(last) / max(1, len(last)):.3f}"])
    console.print(table("Local run: planned, measured, replanned on the measured profiles",
                        ["job", "plan s", "simulated s", "measured s", "replanned s", "measured / plan, replan",
                         "train end -> sync end s (measured / plan)", "reward (first 3)", "reward (last 3)"], rows))
    console.print(f"ran in {result.wall_s:.1f} s wall; records, metrics, job_metrics.csv and pictures in {out / 'run'}; "
                  f"profiles refit from its records -> {fitted_path}; replanned -> {out / 'plan-replanned.yaml'} "
                  f"(${plan.cost_usd_per_hour:,.2f}/h -> ${new_plan.cost_usd_per_hour:,.2f}/h)")
    return 0


def after_train(frame) -> dict[str, float]:
    """Per job, the median time from a train phase's end to the end of its weight sync (checkpoint,
    sync): what the fitted rollout and train profiles leave out of the iteration."""
    out: dict[str, float] = {}
    for job, rows in frame.groupby("job"):
        train = rows[rows.phase == "train"].set_index("iteration")
        sync = rows[rows.phase == "sync"].set_index("iteration")
        both = train.index.intersection(sync.index)
        if len(both):
            ends = sync.loc[both, "start_s"] + sync.loc[both, "duration_s"]
            gaps = ends - (train.loc[both, "start_s"] + train.loc[both, "duration_s"])
            out[str(job)] = float(gaps.median())
    return out
