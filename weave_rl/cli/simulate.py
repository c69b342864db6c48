"""``weave simulate``: run a plan (or a trace) on the discrete-event ``sim`` backend and report.

Thin on purpose: parse and check the inputs, call ``executor`` and render. Registered on the main
app by one line at the end of ``weave_rl/cli/app.py``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from weave_rl.core.errors import InputError
from weave_rl.cli.render import console, err_console, print_json, table

DRIFT_HELP = ("Inject drift: JOB:PHASE:FACTOR@TIME (JOB or PHASE may be *), or a template increasing:M, "
              "decreasing:M, mixed:M (rollouts drift linearly to (1+M)x or 1/(1+M)x over each job's life); "
              "comma-separated.")
FAIL_HELP = "Inject faults: NODE@T+D (node down at T s for D s), comma-separated."


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)


def simulate(
    plan_file: Optional[Path] = typer.Argument(None, metavar="[PLAN]", help="Plan YAML to run."),
    topology: Optional[str] = typer.Option(None, "--topology", "-t", help="Topology file or preset."),
    jobs_file: Optional[Path] = typer.Option(None, "--jobs", "-j", help="Jobs YAML (profiles to sample)."),
    policy: str = typer.Option("optimal", "--policy", help="Without PLAN: optimal | weave | solo | colocate."),
    quantile: str = typer.Option("0.95", "--quantile", "-q", help="Without PLAN: planning quantile, or 'max'."),
    iterations: int = typer.Option(20, "--iterations", "-n", min=1, help="Iterations per job (not with --trace)."),
    trace: bool = typer.Option(False, "--trace", help="Jobs arrive at arrival_s and leave after their iterations."),
    seed: int = typer.Option(0, "--seed", "-s", help="Seed of the sampled durations."),
    drift: Optional[str] = typer.Option(None, "--drift", help=DRIFT_HELP),
    fail: Optional[str] = typer.Option(None, "--fail", help=FAIL_HELP),
    replan: bool = typer.Option(True, "--replan/--no-replan", help="Replan when drift is detected."),
    reopt_every: Optional[float] = typer.Option(None, "--reopt-every", min=1.0,
                                                help="Trace: re-optimize all live jobs every this many seconds, "
                                                     "and when an arrival opens nodes or a departure frees none."),
    migration_cost: float = typer.Option(60.0, "--migration-cost", min=0.0, help="Seconds a moved job pauses."),
    static: bool = typer.Option(False, "--static", help="Ignore the plan's elastic rules (no migration, lending)."),
    no_check: bool = typer.Option(False, "--no-check", help="Simulate a plan that fails the plan checker (experts)."),
    no_link_sharing: bool = typer.Option(False, "--no-link-sharing", help="Syncs do not share link bandwidth."),
    link_policy: str = typer.Option("deadline", "--link-policy",
                                    help="How syncs share a link: deadline (the controller serves the least SLO "
                                         "slack first) or fair (even split, uncoordinated flows)."),
    elastic_model: Optional[Path] = typer.Option(
        None, "--elastic-model", help="Elastic model fitted from real records (weave profile fit --elastic-out): "
        "tail_share, tail_slowdown, lend_gain, per job; replaces the plan's and the built-in assumptions."),
    time_limit: float = typer.Option(10.0, "--time-limit", min=0.01, help="Solver time limit per (re)plan."),
    threads: int = typer.Option(2, "--threads", min=1, max=1024, help="Solver threads."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for records, metrics and pictures."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Skip the PNG and HTML pictures."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", min=0, max=65535,
                                               help="Serve Prometheus metrics on 127.0.0.1:PORT during the run."),
    metrics_linger: float = typer.Option(75.0, "--metrics-linger", min=0.0, max=86400.0,
                                         help="With --metrics-port: keep serving the final values up to S seconds "
                                              "after the run, until one scrape has read them (0: close with the run)."),
) -> None:
    """Simulate a plan: weave simulate PLAN --jobs J --out DIR, or --topology T --jobs J [--trace]."""
    from weave_rl.executor.config import ElasticRules
    from weave_rl.executor.drift import DriftReplanner, parse_drift
    from weave_rl.executor.faults import parse_faults
    from weave_rl.executor.outputs import metrics, write_outputs
    from weave_rl.executor.run import simulate_plan
    from weave_rl.planner.model import PlanningModel
    from weave_rl.planner.plan import POLICIES, load_plan
    from weave_rl.profiles.durations import parse_quantile
    from weave_rl.profiles.jobs import JobSet, load_jobs
    from weave_rl.topology.topology import load_topology
    from weave_rl.planner.fit import require_jobs_fit

    if policy not in POLICIES:
        raise InputError("<command line>", "--policy", f"unknown policy {policy!r} (policies: {', '.join(POLICIES)})")
    try:
        q = parse_quantile(quantile)
    except ValueError as exc:
        raise InputError("<command line>", "--quantile", str(exc)) from None
    if jobs_file is None:
        raise InputError("<command line>", "--jobs", "required: the jobs' profiles are what the simulator samples")
    from weave_rl.core.yamlio import check_output_dir

    check_output_dir(out, "--out")
    plan = load_plan(plan_file) if plan_file is not None else None
    if plan is not None and trace:
        raise InputError("<command line>", "--trace", "a trace plans its own arrivals: give --topology, not a PLAN")
    if topology is None:
        from weave_rl.planner.plan import plan_topology_ref

        topology = plan_topology_ref(plan, plan_file) if plan is not None else None
        if topology is None:
            raise InputError("<command line>", "--topology",
                             "required (the plan records no topology file and its topology is not a preset)"
                             if plan else "required without a PLAN")
    topo = load_topology(topology)
    jobs = load_jobs(jobs_file, topo.gpu_types)
    require_jobs_fit(jobs, topo, str(jobs_file))
    if plan is not None:
        if plan.topology != topo.name:
            raise InputError(str(plan_file), "topology", f"plan is for {plan.topology!r}, topology is {topo.name!r}")
        from weave_rl.core.errors import Problems

        problems = Problems(str(plan_file))
        for name in plan.jobs:
            if name not in jobs.names:
                problems.add("jobs", f"plan job {name!r} is not in the jobs file", file=str(jobs_file))
        from weave_rl.planner.plan import topology_problems

        problems.extend(topology_problems(plan, topo, str(plan_file)))
        problems.raise_if_any()
        if not no_check:
            from weave_rl.planner.check import require_valid

            require_valid(plan, topo, jobs, str(plan_file))
    faults = parse_faults(fail, topo)
    spec = parse_drift(drift, jobs)
    solo_model = PlanningModel(topo, jobs, 0.5)

    def lifetime(name: str) -> float:
        job = jobs[name]
        n = (job.iterations or iterations) if trace else iterations
        return n * solo_model.solo_iteration_s(job)

    injector = spec.injector(jobs, lifetime) if (spec.steps or spec.template) else None
    if link_policy not in ("deadline", "fair"):
        raise InputError("<command line>", "--link-policy", f"expected deadline or fair, got {link_policy!r}")
    model = _sim_model(plan.elastic if plan is not None else {}, not no_link_sharing, link_policy)
    if elastic_model is not None:
        model = _fitted_model(model, elastic_model, jobs.names)
    progress, bar = _progress(not as_json)
    servers: list = []  # the --metrics-port server, closed after --metrics-linger

    def online(base_jobs: JobSet, base_plan, q_plan):
        try:
            from weave_rl.planner.online import OnlinePlanner
        except ImportError:
            raise InputError("<command line>", "--policy",
                             "the optimal policy's online planner (planner.online) is not available") from None
        return OnlinePlanner(topo, base_jobs, base_plan, quantile=q_plan)

    try:
        if trace:
            from weave_rl.executor.trace import BaselinePlanner, empty_plan, run_trace

            if policy == "optimal":
                planner = online(JobSet(), None, q)
            else:
                planner = BaselinePlanner(topo, policy, quantile=q, time_limit_s=time_limit, threads=threads)
            # An empty cluster's plan may carry no elastic block yet: use the defaults then.
            elastic = planner.plan.elastic or empty_plan(topo, policy, q).elastic
            rules = ElasticRules.off() if static else ElasticRules.from_plan(elastic)
            setup = None
            if drift and replan:
                def setup(controller, _backend):
                    controller.extra_drift = DriftReplanner(controller, planner, migration_cost_s=migration_cost,
                                                            time_limit_s=time_limit, threads=threads)
            jobs_for_trace = JobSet(jobs=[j if j.iterations else j.model_copy(update={"iterations": iterations})
                                          for j in jobs.jobs])
            setup = _metrics(metrics_port, setup, servers)
            result = run_trace(topo, jobs_for_trace, planner, seed=seed, rules=rules, model=model, drift=injector,
                               faults=faults, reopt_every_s=reopt_every, migration_cost_s=migration_cost,
                               reopt_time_limit_s=time_limit, threads=threads, progress=progress, setup=setup)
        else:
            if plan is None:
                from weave_rl.planner.api import make_plan

                with err_console.status(f"planning {len(jobs)} jobs ({policy})..."):
                    plan = make_plan(topo, jobs, policy=policy, quantile=q, time_limit_s=time_limit, threads=threads)
            if not plan.groups:
                raise InputError(str(plan_file or jobs_file), "groups", "the plan places no job: nothing to simulate")
            rules = ElasticRules.off() if static else _rules(plan, plan_file)
            setup = None
            if drift and replan:
                if plan.policy == "optimal":
                    planner = online(JobSet(jobs=[jobs[j] for j in plan.jobs]), plan, plan.quantile)
                else:
                    from weave_rl.executor.trace import BaselinePlanner

                    planner = BaselinePlanner(topo, plan.policy, quantile=plan.quantile, time_limit_s=time_limit,
                                              threads=threads)
                    planner.adopt(plan, JobSet(jobs=[jobs[j] for j in plan.jobs]))

                def setup(controller, _backend):
                    controller.extra_drift = DriftReplanner(controller, planner, migration_cost_s=migration_cost,
                                                            time_limit_s=time_limit, threads=threads)
            setup = _metrics(metrics_port, setup, servers)
            result = simulate_plan(plan, topo, jobs, iterations=iterations, seed=seed, rules=rules, model=model,
                                   drift=injector, faults=faults, progress=progress, setup=setup)
    finally:
        if bar is not None:
            bar.stop()
    controller = result.controller
    data = metrics(controller, wall_s=result.wall_s, events=result.events, plan_iteration=not trace)
    replanner = getattr(controller, "extra_drift", None)
    data["replans"] = replanner.log if replanner is not None else []
    data["drift_detections"] = replanner.detections if replanner is not None else []
    if trace:
        log = result.extra["trace"]
        data["never_admitted"] = log.never_admitted
        data["mean_admission_wait_s"] = (sum(log.waits.values()) / len(log.waits)) if log.waits else 0.0
        data["reopts"] = log.reopts
    data["inputs"] = {"plan": str(plan_file) if plan_file else None, "topology": topo.name, "jobs": str(jobs_file),
                      "policy": plan.policy if plan else policy, "seed": seed, "iterations": None if trace else iterations,
                      "trace": trace, "drift": drift, "fail": fail, "elastic": not static,
                      "link_sharing": not no_link_sharing, "link_policy": link_policy,
                      "elastic_model": str(elastic_model) if elastic_model else None}
    paths = write_outputs(out, controller, data)
    if not no_plots:
        from weave_rl.executor.outputs import records_table
        from weave_rl.executor.plots import draw_all

        frame = records_table(controller)
        cycles = [g.cycle_s for g in controller.plan.groups]
        marks = [(e["t"], e["event"]) for e in controller.events if e["event"] in ("node_down", "node_up", "switch")]
        paths += draw_all(out, frame, controller.held_timeline, controller.now,
                          cycle_hint=max(cycles) if cycles else None, marks=marks[:50])
    if as_json:
        print_json({k: v for k, v in _json_safe(data).items() if k not in ("per_job", "log")})
    else:
        _summary(data, out, len(paths))
    if servers:
        from weave_rl.executor.monitoring import linger_and_close

        linger_and_close(servers, metrics_linger, lambda text: err_console.print(text, highlight=False))


def _sim_model(elastic: dict, link_sharing: bool, link_policy: str = "deadline"):
    """The tail model may be tuned in the plan's ``elastic.long_tail_migration`` (tail_share, tail_slowdown)."""
    from weave_rl.executor.sim import SimModel

    ltm = elastic.get("long_tail_migration") if isinstance(elastic, dict) else None
    ltm = ltm if isinstance(ltm, dict) else {}
    defaults = SimModel()
    try:
        tail_share = float(ltm.get("tail_share", defaults.tail_share))
        tail_slowdown = float(ltm.get("tail_slowdown", defaults.tail_slowdown))
    except (TypeError, ValueError):
        raise InputError("<plan>", "elastic.long_tail_migration", "tail_share and tail_slowdown must be numbers") from None
    if not 0 <= tail_share < 1 or tail_slowdown < 1:
        raise InputError("<plan>", "elastic.long_tail_migration",
                         f"need 0 <= tail_share < 1 and tail_slowdown >= 1 (got {tail_share}, {tail_slowdown})")
    return SimModel(tail_share=tail_share, tail_slowdown=tail_slowdown, link_sharing=link_sharing,
                    link_policy=link_policy)


def _fitted_model(model, path: Path, jobs: list[str]):
    """``model`` with the fitted elastic parameters of ``path`` (keys it leaves out keep ``model``'s)."""
    from dataclasses import replace

    from weave_rl.profiles.elastic_fit import load_elastic_model

    default, per_job = load_elastic_model(path, jobs, model.default)
    return replace(model, tail_share=default.tail_share, tail_slowdown=default.tail_slowdown,
                   lend_gain=default.lend_gain, jobs=per_job)


def _metrics(port: Optional[int], setup, servers: Optional[list] = None):
    if port is None:
        return setup
    from weave_rl.executor.monitoring import metrics_setup

    return metrics_setup(port, setup, announce=lambda url: err_console.print(f"metrics on {url}", highlight=False),
                         servers=servers)


def _rules(plan, plan_file):
    from weave_rl.executor.config import ElasticRules

    try:
        return ElasticRules.from_plan(plan.elastic)
    except ValueError as exc:
        raise InputError(str(plan_file or "<plan>"), "elastic", str(exc)) from None


def _progress(enabled: bool):
    if not enabled:
        return None, None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                   TextColumn("t={task.fields[t]:,.0f} s"), TimeElapsedColumn(), console=err_console, transient=True)
    task = bar.add_task("sim", total=1.0, t=0.0)
    bar.start()

    def update(share: float, t: float) -> None:
        bar.update(task, completed=share, t=t)

    return update, bar


def _json_safe(data):
    from weave_rl.executor.outputs import json_safe

    return json_safe(data)


def _fmt(x, digits=2):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return round(x, digits) if isinstance(x, float) else x


def _summary(data: dict, out: Path, files: int) -> None:
    head = (f"simulated {data['horizon_s']:,.0f} s: {data['jobs']} jobs, {data['iterations']} iterations, "
            f"avg ${data['avg_usd_per_hour']:,.2f}/h (peak ${data['peak_usd_per_hour']:,.2f}/h), "
            f"SLO attainment {100 * data['slo_attainment']:.1f}%, {data['events']:,} events in "
            f"{data['wall_s']:.2f} s ({data['events_per_s']:,.0f}/s)")
    console.print(head, highlight=False)
    rows = []
    for name, j in sorted(data["per_job"].items())[:40]:
        rows.append([name, j["iterations"], _fmt(j["planned_iteration_s"]), _fmt(j["steady_iteration_s"]),
                     _fmt(j["iteration_s"]), _fmt(j["solo_iteration_s"]), j["slo"], "yes" if j["slo_met"] else "NO",
                     j["restarts"]])
    console.print(table("Jobs" + (" (first 40)" if len(data["per_job"]) > 40 else ""),
                        ["job", "iters", "plan s", "steady s", "mean s", "solo s", "SLO", "met", "restarts"], rows))
    console.print(table("Clusters", ["cluster", "peak GPUs", "util %", "switch %", "bubble %"],
                        [[c, data["peak_gpus"].get(c, 0), f"{100 * v['utilization']:.1f}",
                          f"{100 * v['switch_share']:.1f}", f"{100 * v['bubble_share']:.1f}"]
                         for c, v in data["clusters"].items()]))
    for r in data.get("replans", []):
        console.print(f"replan at {r['t']:,.0f} s: {r['reason']}; ${_fmt(r['usd_per_hour_before'])}/h -> "
                      f"${_fmt(r['usd_per_hour_after'])}/h; moved {', '.join(r['moved']) or 'none'}", highlight=False)
    restarts = [e for e in data["log"] if e["event"] == "restart"]
    for e in restarts[:10]:
        console.print(f"restart at {e['t']:,.1f} s: {e['job']} from iteration {e['iteration']} ({e['reason']})",
                      highlight=False)
    console.print(f"wrote {files} files to {out}")
