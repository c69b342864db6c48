"""The ``weave`` command line: parse, call a library function, render. Errors exit 2 without a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from weave_rl import __version__
from weave_rl.core.errors import InputError
from weave_rl.core.yamlio import check_output_file
from weave_rl.cli.render import console, err_console, print_json, table

app = typer.Typer(help="Weave: co-scheduling plans for disaggregated RL post-training.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
topology_app = typer.Typer(help="Cluster topologies (files and presets).", no_args_is_help=True)
jobs_app = typer.Typer(help="Job specs: show and generate workloads.", no_args_is_help=True)
profile_app = typer.Typer(help="Measured stage times -> job specs.", no_args_is_help=True)
app.add_typer(topology_app, name="topology")
app.add_typer(jobs_app, name="jobs")
app.add_typer(profile_app, name="profile")

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of tables.")
PLAN_ARGUMENT = typer.Argument(..., metavar="PLAN")
PLANS_TOPOLOGY = typer.Option(None, "--topology", "-t", help="Default: the plan's.")
NEXT_PLAN = typer.Option(None, "-o", "--out", help="Updated plan YAML to write.")


def _version(value: bool) -> None:
    if value:
        print(f"weave {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Weave: co-scheduling plans for disaggregated RL post-training."""


# ----- topology -------------------------------------------------------------------------------
@topology_app.command("show")
def topology_show(source: str = typer.Argument(..., metavar="FILE|PRESET"), as_json: bool = JSON_OPTION) -> None:
    """Show a topology: clusters, links, GPU counts and $/h."""
    from weave_rl.topology.topology import load_topology, topology_to_data

    topo = load_topology(source)
    summary = {
        "name": topo.name,
        "nodes": len(topo.nodes),
        "gpus": topo.total_gpus,
        "usd_per_hour": round(topo.cost_usd_per_hour(), 2),
    }
    if as_json:
        print_json({**topology_to_data(topo), "summary": summary,
                    "gpu_catalog": {k: v.model_dump() for k, v in topo.gpu_types.items()}})
        return
    rows = []
    for c in topo.clusters.values():
        price = topo.gpu_types[c.gpu_type].usd_per_hour
        rows.append([c.name, c.gpu_type, c.nodes, c.gpus_per_node, c.nodes * c.gpus_per_node, c.host_mem_gb,
                     c.fabric_gbps, c.pcie_gbps, c.nvlink_gbps, round(price * c.nodes * c.gpus_per_node, 2)])
    console.print(table(f"Topology {topo.name}",
                        ["cluster", "GPU", "nodes", "GPUs/node", "GPUs", "host GB", "fabric Gb/s", "PCIe Gb/s",
                         "NVLink Gb/s", "$/h"], rows, right_from=2))
    if topo.spec.links:
        console.print(table("Links", ["between", "Gb/s", "latency ms"],
                            [[" <-> ".join(l.between), l.gbps, l.latency_ms] for l in topo.spec.links]))
    console.print(f"{summary['nodes']} nodes, {summary['gpus']} GPUs, ${summary['usd_per_hour']:,.2f}/h in all")


# ----- jobs -----------------------------------------------------------------------------------
@jobs_app.command("show")
def jobs_show(file: Path = typer.Argument(..., metavar="FILE"),
              topology: Optional[str] = typer.Option(None, "--topology", "-t",
                                                     help="Also check every job fits this topology."),
              quantile: str = typer.Option("0.95", "--quantile", "-q", help="Planning quantile, or 'max'."),
              as_json: bool = JSON_OPTION) -> None:
    """Show a jobs file: phases, GPUs, durations at the planning quantile, host memory."""
    from weave_rl.profiles.jobs import jobs_to_data, load_jobs
    from weave_rl.planner.fit import require_jobs_fit

    q = _parse_quantile(quantile)
    topo = None
    if topology:
        topo, jobs, _ = _load_inputs(topology, file)
    else:
        jobs = load_jobs(file)
    if topo:
        require_jobs_fit(jobs, topo, str(file))
    if as_json:
        print_json(jobs_to_data(jobs))
        return
    rows = []
    for job in jobs.jobs:
        r, t = job.rollout, job.train
        rows.append([job.name, job.params_b, job.slo, job.max_staleness,
                     f"{r.gpus} {r.gpu_type}", round(r.duration_s.quantile(q), 1), r.host_mem_gb,
                     f"{t.gpus} {t.gpu_type}", round(t.duration_s.quantile(q), 1), t.host_mem_gb,
                     job.arrival_s])
    console.print(table(f"{len(jobs.jobs)} jobs in {file} (durations at q={quantile})",
                        ["job", "params B", "SLO", "stale", "rollout", "rollout s", "rollout GB", "train",
                         "train s", "train GB", "arrival s"], rows))


@jobs_app.command("generate")
def jobs_generate(family: str = typer.Argument(..., help="micro | BL | RH | TH | Mixed | seed | Production | Hetero "
                                              "(any case)"),
                  count: int = typer.Option(8, "--count", "-n", min=1, max=100_000, help="Number of jobs."),
                  seed: int = typer.Option(0, "--seed", "-s", help="Random seed."),
                  out: Path = typer.Option(..., "-o", "--out", help="Jobs YAML to write.")) -> None:
    """Generate a reference workload (Weave micro-benchmarks, synthetic families, the seed job, the production
    trace, mixed-shape Hetero jobs)."""
    from weave_rl.profiles.generators import FAMILIES, generate
    from weave_rl.profiles.jobs import save_jobs

    if family.lower() not in {f.lower() for f in FAMILIES}:
        raise InputError("<command line>", "FAMILY", f"unknown family {family!r} (families: {', '.join(FAMILIES)})")
    check_output_file(out, "--out")
    jobs = generate(family, count, seed)
    save_jobs(jobs, out)
    console.print(f"wrote {len(jobs.jobs)} {family} jobs (seed {seed}) to {out}")


# ----- profile --------------------------------------------------------------------------------
@profile_app.command("fit")
def profile_fit(records: Path = typer.Argument(..., metavar="RECORDS", help="Measured records, CSV or parquet."),
                jobs_file: Path = typer.Option(..., "--jobs", "-j", help="Jobs YAML to update."),
                out: Path = typer.Option(..., "-o", "--out", help="Updated jobs YAML to write."),
                topology: Optional[str] = typer.Option(None, "--topology", "-t", help="Topology whose GPU types the "
                                                       "records may name (default: the built-in catalog)."),
                elastic_out: Optional[Path] = typer.Option(
                    None, "--elastic-out", help="Also write the sim's elastic model (tail_share, tail_slowdown, "
                    "lend_gain, per job) fitted from the elastic rollout rows, for weave simulate --elastic-model.")
                ) -> None:
    """Refit job profiles from measured records (DESIGN 3.4); elastic rollout rows also fit the simulator's
    elastic model (profiles/elastic_fit.py), printed and, with --elastic-out, written."""
    from weave_rl.core.errors import Problems
    from weave_rl.core.yamlio import dump_yaml, write_text_file
    from weave_rl.profiles.elastic_fit import describe, elastic_model_data, fit_elastic
    from weave_rl.profiles.fit import fit_jobs, row_problems
    from weave_rl.profiles.jobs import load_jobs, save_jobs
    from weave_rl.profiles.records import read_records
    from weave_rl.topology.catalog import BUILTIN_GPU_TYPES

    if out.is_dir():
        check_output_file(out, "--out")
    catalog = BUILTIN_GPU_TYPES
    if topology:
        from weave_rl.topology.topology import load_topology

        catalog = load_topology(topology).gpu_types
    problems = Problems(str(jobs_file))  # both inputs' problems at once
    jobs = frame = None
    with problems.collect():
        jobs = load_jobs(jobs_file, catalog)
    with problems.collect():  # the names in the records are checked against the jobs even beside bad numbers
        check = (lambda f: row_problems(f, jobs, str(records), catalog)) if jobs is not None else None
        frame = read_records(records, check)
    problems.raise_if_any()
    check_output_file(out, "--out")
    if elastic_out is not None:
        check_output_file(elastic_out, "--elastic-out")
    fitted = fit_jobs(frame, jobs, records_file=str(records), gpu_types=catalog)
    elastic = fit_elastic(frame, str(records))
    if elastic_out is not None and elastic is None:
        raise InputError(str(records), "shares", "no elastic rollout rows (a --static run?): nothing for --elastic-out")
    save_jobs(fitted, out)
    console.print(f"fitted {len(frame)} records onto {len(fitted.jobs)} jobs; wrote {out}")
    if elastic is not None:
        console.print(f"elastic model from {elastic.rows} rollout rows ({elastic.lent_rows} with a lent GPU, "
                      f"{elastic.taken_back_rows} had groups taken back): {describe(elastic.default)}", highlight=False)
        for name, params in elastic.jobs.items():
            console.print(f"  {name}: {describe(params)}", highlight=False)
        if elastic_out is not None:
            write_text_file(elastic_out, dump_yaml(elastic_model_data(elastic, str(records))))
            console.print(f"wrote {elastic_out}")


# ----- demo ---------------------------------------------------------------------------------
@app.command("demo")
def demo(out: Path = typer.Option(Path("out/demo"), "--out", help="Folder for the example's files."),
         count: int = typer.Option(20, "--count", min=1, help="Jobs in the example workload."),
         seed: int = typer.Option(1, "--seed", help="Workload seed."),
         time_limit: float = typer.Option(60.0, "--time-limit", min=0.1, help="Solver time limit, seconds."),
         real_iterations: int = typer.Option(20, "--real-iterations", min=0,
                                             help="Iterations of the short real run on local workers (0: skip it).")) -> None:
    """Run the embedded example end to end: topology, workload, plans by every policy, pictures, a
    simulation, and a short real run of two GRPO jobs on local worker processes."""
    from weave_rl.cli.demo import run_demo

    code = run_demo(out, console, jobs=count, seed=seed, time_limit_s=time_limit, real_iterations=real_iterations)
    if code:
        raise typer.Exit(code)


# ----- plan ---------------------------------------------------------------------------------
plan_app = typer.Typer(help="Plan, check and draw co-scheduling plans.", invoke_without_command=True)
app.add_typer(plan_app, name="plan")


@plan_app.callback()
def plan(ctx: typer.Context,
         topology: Optional[str] = typer.Option(None, "--topology", "-t", help="Topology file or preset."),
         jobs_file: Optional[Path] = typer.Option(None, "--jobs", "-j", help="Jobs YAML."),
         out: Optional[Path] = typer.Option(None, "-o", "--out", help="Plan YAML to write."),
         policy: str = typer.Option("optimal", "--policy", help="optimal | weave | solo | colocate"),
         quantile: str = typer.Option("0.95", "--quantile", "-q", help="Planning quantile, or 'max'."),
         time_limit: float = typer.Option(60.0, "--time-limit", min=0.01, help="Solver time limit, seconds."),
         threads: int = typer.Option(2, "--threads", min=1, max=1024, help="Solver threads."),
         max_group_size: int = typer.Option(5, "--max-group-size", min=1, help="Most jobs in one group."),
         objective: str = typer.Option("cost", "--objective", help="cost | iteration-time | throughput (iterations per $)"),
         solver: str = typer.Option("auto", "--solver", help="Integer master: auto | cpsat | pulp (CBC)."),
         start: Optional[Path] = typer.Option(None, "--from", help="Previous plan to start from."),
         as_json: bool = JSON_OPTION) -> None:
    """Plan jobs on a topology: weave plan --topology T --jobs J -o plans/NAME.yaml"""
    if ctx.invoked_subcommand is not None:
        return
    from weave_rl.planner.api import OBJECTIVES, make_plan
    from weave_rl.planner.check import check_plan, format_violations
    from weave_rl.planner.plan import POLICIES, plan_to_data, save_plan

    if topology is None or jobs_file is None:
        raise InputError("<command line>", "--topology" if topology is None else "--jobs",
                         "required to plan (or use a subcommand: check, show, admit, release, replan)")
    if policy not in POLICIES:
        raise InputError("<command line>", "--policy", f"unknown policy {policy!r} (policies: {', '.join(POLICIES)})")
    if objective not in OBJECTIVES:
        raise InputError("<command line>", "--objective",
                         f"unknown objective {objective!r} (objectives: {', '.join(OBJECTIVES)})")
    if objective == "throughput" and policy != "optimal":
        raise InputError("<command line>", "--objective",
                         f"the throughput objective is the optimal policy's (got --policy {policy})")
    from weave_rl.planner.optimize import SOLVERS

    if solver not in SOLVERS:
        raise InputError("<command line>", "--solver", f"unknown solver {solver!r} (solvers: {', '.join(SOLVERS)})")
    q = _parse_quantile(quantile)
    if out is not None and out.is_dir():
        check_output_file(out, "--out")
    topo, jobs, previous = _load_inputs(topology, jobs_file, start)
    if previous is not None:
        _require_plan_on(previous, topo, start)
    if out is not None:  # before the solver's minutes, after the inputs (no folder made for bad inputs)
        check_output_file(out, "--out")
    with err_console.status(f"planning {len(jobs.jobs)} jobs ({policy}, {objective})...") as status:
        result = make_plan(topo, jobs, policy=policy, objective=objective, quantile=q, time_limit_s=time_limit,
                           threads=threads, max_group_size=max_group_size, solver=solver, start=previous,
                           progress=lambda msg: status.update(f"planning: {msg}"))
    violations = check_plan(result, topo, jobs)
    if out is not None:
        from weave_rl.planner.plan import topology_source_for

        result = result.model_copy(update={"topology_source": topology_source_for(topology, out)})
        save_plan(result, out)
    if as_json:
        print_json(plan_to_data(result))
    else:
        _print_plan_summary(result, topo, out)
    if violations:
        err_console.print("[bold red]internal error: the plan fails the checker:[/]\n" + format_violations(violations))
        raise typer.Exit(1)
    if result.rejected:
        for r in result.rejected:
            err_console.print(f"[yellow]rejected[/] {r.name}: {r.reason}", highlight=False)
        raise typer.Exit(3)


def _online(plan_file: Path, topology: Optional[str], jobs_file: Path, max_group_size: int = 5):
    """The online planner on a saved plan (its own topology unless one is given)."""
    from weave_rl.planner.online import OnlinePlanner
    from weave_rl.planner.plan import load_plan
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    from weave_rl.planner.plan import plan_topology_ref

    the_plan = load_plan(plan_file)
    topo = load_topology(topology or plan_topology_ref(the_plan, plan_file) or the_plan.topology)
    jobs = load_jobs(jobs_file, topo.gpu_types)
    _require_plan_on(the_plan, topo, plan_file)
    return OnlinePlanner(topo, jobs, the_plan, max_group_size=max_group_size, source=str(plan_file)), topo, jobs


def _write_online(result, topo, jobs, out: Optional[Path], as_json: bool, title: str) -> None:
    from weave_rl.planner.check import check_plan, format_violations
    from weave_rl.planner.plan import Plan, plan_to_data, save_plan

    result = Plan.model_validate(result.model_dump())
    violations = check_plan(result, topo, jobs)
    if out is not None:
        from weave_rl.planner.plan import topology_source_for

        # the new plan records the topology it was made on, relative to its own folder
        source = topo.source.removeprefix("preset ")
        result = result.model_copy(update={"topology_source": topology_source_for(source, out)})
        save_plan(result, out)
    if as_json:
        print_json(plan_to_data(result))
    else:
        console.print(title, highlight=False)
        _print_plan_summary(result, topo, out)
    if violations:
        err_console.print("[bold red]internal error: the plan fails the checker:[/]\n" + format_violations(violations))
        raise typer.Exit(1)


@plan_app.command("admit")
def plan_admit(plan_file: Path = PLAN_ARGUMENT,
               job: str = typer.Option(..., "--job", help="Name of the arriving job (in the jobs file)."),
               jobs_file: Path = typer.Option(..., "--jobs", "-j", help="Jobs YAML with the plan's jobs and the new one."),
               topology: Optional[str] = PLANS_TOPOLOGY,
               out: Optional[Path] = NEXT_PLAN,
               max_group_size: int = typer.Option(5, "--max-group-size", min=1, help="Most jobs in one group."),
               as_json: bool = JSON_OPTION) -> None:
    """Place one arriving job without moving the others (exit 3 when it is rejected)."""
    if out is not None:
        check_output_file(out, "--out")
    online, topo, jobs = _online(plan_file, topology, jobs_file, max_group_size)
    if job not in jobs.names:
        raise InputError(str(jobs_file), "jobs", f"no job named {job!r}")
    if job in online.plan.jobs:
        raise InputError(str(plan_file), "groups", f"job {job!r} is already placed")
    admission = online.admit(jobs[job])
    title = (f"admitted {job} into {admission.group} (+${admission.added_usd_per_hour:,.2f}/h)" if admission.placed
             else f"rejected {job}: {admission.reason}")
    _write_online(admission.plan, topo, jobs, out, as_json, title)
    if not admission.placed:
        raise typer.Exit(3)


@plan_app.command("release")
def plan_release(plan_file: Path = PLAN_ARGUMENT,
                 job: str = typer.Option(..., "--job", help="Name of the finished job."),
                 jobs_file: Path = typer.Option(..., "--jobs", "-j", help="Jobs YAML of the plan."),
                 topology: Optional[str] = PLANS_TOPOLOGY,
                 out: Optional[Path] = NEXT_PLAN,
                 as_json: bool = JSON_OPTION) -> None:
    """Free a finished job's share of its group (and the nodes nobody else uses)."""
    if out is not None:
        check_output_file(out, "--out")
    online, topo, jobs = _online(plan_file, topology, jobs_file)
    if job not in online.plan.jobs and not any(r.name == job for r in online.rejected):
        raise InputError(str(plan_file), "groups", f"job {job!r} is not in the plan")
    before = online.plan.cost_usd_per_hour
    result = online.release(job)
    from weave_rl.profiles.jobs import JobSet

    live = JobSet(jobs=[j for j in jobs.jobs if j.name != job])  # the released job is neither placed nor due
    _write_online(result, topo, live, out, as_json,
                  f"released {job}: ${before:,.2f}/h -> ${result.cost_usd_per_hour:,.2f}/h")


@plan_app.command("replan")
def plan_replan(plan_file: Path = PLAN_ARGUMENT,
                jobs_file: Path = typer.Option(..., "--jobs", "-j", help="Jobs YAML with current profiles."),
                topology: Optional[str] = PLANS_TOPOLOGY,
                out: Optional[Path] = NEXT_PLAN,
                migration_cost: float = typer.Option(60.0, "--migration-cost", min=0,
                                                     help="Seconds of its GPUs a moved job costs."),
                time_limit: float = typer.Option(30.0, "--time-limit", min=0.01, help="Solver time limit, seconds."),
                threads: int = typer.Option(2, "--threads", min=1, max=1024, help="Solver threads."),
                as_json: bool = JSON_OPTION) -> None:
    """Re-optimize a running plan for new profiles; a job moves only when it pays its migration."""
    if out is not None:
        check_output_file(out, "--out")
    online, topo, jobs = _online(plan_file, topology, jobs_file)
    with err_console.status("replanning..."):
        result = online.replan(jobs, migration_cost_s=migration_cost, time_limit_s=time_limit, threads=threads)
    title = (f"replanned: ${result.cost_before:,.2f}/h -> ${result.cost_after:,.2f}/h, "
             f"{len(result.moved)} jobs moved" + (f" ({', '.join(result.moved)})" if result.moved else ""))
    _write_online(result.plan, topo, jobs, out, as_json, title)
    if result.plan.rejected:
        raise typer.Exit(3)


@plan_app.command("check")
def plan_check(plan_file: Path = PLAN_ARGUMENT,
               topology: str = typer.Option(..., "--topology", "-t", help="Topology file or preset."),
               jobs_file: Path = typer.Option(..., "--jobs", "-j", help="Jobs YAML."),
               as_json: bool = JSON_OPTION) -> None:
    """Check a plan against every rule of DESIGN 3.3, independently of the solver."""
    from weave_rl.planner.check import check_plan

    topo, jobs, the_plan = _load_inputs(topology, jobs_file, plan_file)
    violations = check_plan(the_plan, topo, jobs)
    if as_json:
        print_json([v.__dict__ for v in violations])
    elif violations:
        console.print(table(f"{len(violations)} violations in {plan_file}", ["rule", "where", "problem"],
                            [[v.rule, v.where, v.message] for v in violations], right_from=99))
    else:
        console.print(f"{plan_file}: valid ({len(the_plan.groups)} groups, "
                      f"{sum(len(g.jobs) for g in the_plan.groups)} jobs, ${the_plan.cost_usd_per_hour:,.2f}/h)")
    if violations:
        raise typer.Exit(1)


@plan_app.command("show")
def plan_show(plan_file: Path = PLAN_ARGUMENT,
              png: Optional[Path] = typer.Option(None, "--png", help="Write a Gantt chart PNG."),
              html: Optional[Path] = typer.Option(None, "--html", help="Write an interactive Gantt HTML."),
              by: str = typer.Option("node", "--by", help="Rows per node or per gpu."),
              cycles: int = typer.Option(2, "--cycles", min=1, max=1000, help="Cycles to draw."),
              topology: Optional[str] = typer.Option(None, "--topology", "-t", help="For utilization figures.")) -> None:
    """Summarise a plan; draw per-group Gantt charts of its cycles."""
    from weave_rl.planner.plan import load_plan

    if by not in ("node", "gpu"):
        raise InputError("<command line>", "--by", f"expected node or gpu, got {by!r}")
    for path, option in ((png, "--png"), (html, "--html")):
        if path is not None:
            check_output_file(path, option)
    the_plan = load_plan(plan_file)
    topo = None
    if topology:
        from weave_rl.topology.topology import load_topology

        from weave_rl.planner.plan import topology_problems

        topo = load_topology(topology)
        if problems := topology_problems(the_plan, topo, str(plan_file)):
            raise InputError.many(problems)
    _print_plan_summary(the_plan, topo, None)
    if png:
        from weave_rl.planner.gantt import gantt_png

        console.print(f"wrote {gantt_png(the_plan, png, cycles=cycles, by=by)}")
    if html:
        from weave_rl.planner.gantt import gantt_html

        console.print(f"wrote {gantt_html(the_plan, html, cycles=cycles, by=by)}")


def _print_plan_summary(the_plan, topo, out: Optional[Path]) -> None:
    from weave_rl.planner.summary import cluster_use

    s = the_plan.solver
    lb = the_plan.lower_bound_usd_per_hour
    head = f"[bold]{the_plan.policy}[/] plan on {the_plan.topology}: [bold]${the_plan.cost_usd_per_hour:,.2f}/h[/]"
    if lb is not None:
        head += f", lower bound ${lb:,.2f}/h (gap {100 * (s.gap or 0):.2f}%)"
    head += f"; solver {s.name} {s.status} in {s.wall_s:.2f} s"
    if the_plan.rejected:  # a status and bound about fewer jobs: say so in the first line (exit 3 follows)
        placed = sum(len(g.jobs) for g in the_plan.groups)
        head += f"; [bold yellow]{placed} of {placed + len(the_plan.rejected)} jobs placed[/]"
    console.print(head)
    if s.note:
        console.print(f"note: {s.note}", highlight=False)
    rows = []
    for g in the_plan.groups:
        for j in g.jobs:
            slo = f"{j.slo:g}" if j.slo is not None else "-"
            rows.append([g.name, round(g.cycle_s, 2), j.name, round(j.solo_iteration_s, 2), round(j.iteration_s, 2),
                         f"{j.slowdown:.3f}", slo, ", ".join(j.nodes)])
    console.print(table(f"{len(the_plan.groups)} groups", ["group", "cycle s", "job", "solo s", "iteration s",
                                                            "slowdown", "SLO", "nodes"], rows, right_from=1))
    if topo is not None:
        use = cluster_use(the_plan, topo)
        console.print(table("Clusters", ["cluster", "GPUs held", "busy %", "bubble %"],
                            [[u.cluster, u.gpus, f"{100 * u.busy_share:.1f}", f"{100 * u.bubble_share:.1f}"]
                             for u in use]))
    if out is not None:
        console.print(f"wrote {out}")


def _require_plan_on(the_plan, topo, plan_file) -> None:
    """An ``InputError`` listing why ``the_plan`` cannot be used on ``topo``: another topology's name,
    and every node and GPU the topology does not have."""
    from weave_rl.planner.plan import topology_problems

    problems = []
    if the_plan.topology != topo.name:
        from weave_rl.core.errors import Problem

        problems.append(Problem(str(plan_file), "topology", f"plan is for {the_plan.topology!r}, the topology given "
                                f"is {topo.name!r}"))
    problems += topology_problems(the_plan, topo, str(plan_file))
    if problems:
        raise InputError.many(problems)


def _load_inputs(topology: str, jobs_file: Path, plan_file: Optional[Path] = None):
    """Topology, jobs (and a plan): every problem of all of them at once, not only the first file's.

    When the topology is broken, the jobs are still checked against the built-in catalog, leaving out
    unknown GPU types (the topology may have meant to define them)."""
    from weave_rl.core.errors import Problems
    from weave_rl.planner.plan import load_plan
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    problems = Problems(topology)
    topo = jobs = the_plan = None
    with problems.collect():
        topo = load_topology(topology)
    try:
        jobs = load_jobs(jobs_file, topo.gpu_types) if topo is not None else load_jobs(jobs_file)
    except InputError as exc:
        problems.extend([p for p in exc.problems if topo is not None or not p.reason.startswith("unknown GPU type")])
    if plan_file is not None:
        with problems.collect():
            the_plan = load_plan(plan_file)
    problems.raise_if_any()
    return topo, jobs, the_plan


def _parse_quantile(text: str) -> float | str:
    from weave_rl.profiles.durations import parse_quantile

    try:
        return parse_quantile(text)
    except ValueError as exc:
        raise InputError("<command line>", "--quantile", str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes print their problems (one per line) and exit 2; usage errors keep the
    parser's exit 2. A file that cannot be read or written (a full disk, a directory in the way) prints
    the OS's reason and exits 2 as well; ``WEAVE_DEBUG=1`` shows the traceback instead."""
    from rich.markup import escape

    try:
        app(args=argv, prog_name="weave", standalone_mode=True)
    except InputError as exc:
        # Escaped: a key like ``gpu_types[H20]`` or a value in brackets is text, not rich markup.
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except OSError as exc:
        if os.environ.get("WEAVE_DEBUG"):
            raise
        from weave_rl.core.yamlio import describe_os_error

        err_console.print(f"[bold red]error:[/] {escape(describe_os_error(exc, with_file=True))}", highlight=False, soft_wrap=True)
        return 2
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def run() -> None:
    """Console-script wrapper: exit with main()'s code. A ``ray.init`` left stuck in its thread (the
    --connect-timeout gave up on it) would abort the interpreter's teardown inside Ray's C++ core
    (``std::bad_alloc``, exit -6): then the process leaves at once, its output flushed."""
    code = main()
    if "ray" in sys.modules:
        from weave_rl.executor.ray_backend.cluster import init_left_running

        if init_left_running():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


from weave_rl.cli.simulate import register as _register_simulate  # noqa: E402 (needs ``app`` above)

_register_simulate(app)  # weave simulate (executor, sim backend)
from weave_rl.cli.run import register as _register_run  # noqa: E402

_register_run(app)  # weave run (executor, local backend)
from weave_rl.cli.stack import register as _register_stack  # noqa: E402 (needs the sub-apps above)

_register_stack(profile_app, plan_app)  # weave profile import, weave plan export
from weave_rl.cli.report import register as _register_report  # noqa: E402

_register_report(app)  # weave report (HTML page of a run folder)
if __name__ == "__main__":
    run()
