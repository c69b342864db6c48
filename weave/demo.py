"""The main job on the embedded example: the Weave testbed, a 20-job Mixed workload, plans by every
policy, the optimal plan checked and drawn."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from planner.api import make_plan
from planner.check import check_plan, format_violations
from planner.plan import save_plan
from planner.summary import cluster_use
from profiles.generators import generate
from profiles.jobs import save_jobs
from topology.topology import load_topology
from weave.render import table


def run_demo(out: Path, console: Console, *, jobs: int = 20, seed: int = 1, time_limit_s: float = 60.0) -> int:
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
    from planner.gantt import gantt_html, gantt_png

    png = gantt_png(best, out / "plan-optimal.png")
    html = gantt_html(best, out / "plan-optimal.html")
    console.print(f"[bold]4. Pictures[/] {png}, {html}")
    return 0
