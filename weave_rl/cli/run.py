"""``weave run``: execute a plan on real worker processes of this machine (the ``local`` backend).

Thin on purpose: parse and check the inputs, call ``weave_rl.executor.local.run.run_plan_local``, write the
same outputs as ``weave simulate`` (records parquet + CSV, metrics.json, Gantt PNG + HTML) plus
``job_metrics.csv`` (reward and loss per job and iteration). Registered on the main app by one line
at the end of ``weave_rl/cli/app.py``.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import Optional

import typer

from weave_rl.core.errors import InputError
from weave_rl.cli.render import console, err_console, print_json, table

MAP_HELP = ("Logical GPU -> device, e.g. train-000:0=cpu:0,rollout-000:0=cpu:1 (cpu:N or cuda:N); "
            "unmapped GPUs go round-robin over this machine's devices.")


def _saved_inputs(folder: Path) -> dict:
    """The inputs journaled in ``folder/run.json``, checked (a clear ``InputError`` when it is missing,
    empty, cut short or garbled; every problem listed)."""
    import json

    from weave_rl.core.errors import Problems
    from weave_rl.core.yamlio import read_text_file

    path = folder / "run.json"
    name = str(path)
    if folder.exists() and not folder.is_dir():
        raise InputError("<command line>", "--resume", f"{folder} is a file, not a run folder")
    if not path.exists():
        raise InputError(str(folder), "run.json", "not a weave run folder (no run.json to resume from)")
    text = read_text_file(path, "JSON file")
    if not text.strip():
        raise InputError(name, None, "empty (the run was cut off before it started); start it again without --resume")
    try:
        saved = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(name, None, f"not valid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InputError(name, None, "not valid JSON: nested too deeply") from None
    if not isinstance(saved, dict):
        raise InputError(name, None, f"expected a JSON object of the run's inputs (got {type(saved).__name__})")
    problems = Problems(name)
    for key in ("plan", "jobs", "topology"):
        if key not in saved:
            problems.add(key, "required key is missing")
        elif not isinstance(saved[key], str) or not saved[key]:
            problems.add(key, f"expected a file name or preset (got {saved[key]!r})")
    checks = {"iterations": (1, True), "seed": (0, False), "threads": (1, False)}
    for key, (least, required) in checks.items():
        if key not in saved:
            if required:
                problems.add(key, "required key is missing")
            continue
        value = saved[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            problems.add(key, f"expected an integer >= {least} (got {value!r})")
    for key in ("drift_threshold", "migration_cost"):
        value = saved.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            problems.add(key, f"expected a number >= 0 (got {value!r})")
    for key in ("map", "backend", "address"):
        if saved.get(key) is not None and not isinstance(saved[key], str):
            problems.add(key, f"expected a string (got {saved[key]!r})")
    problems.raise_if_any()
    return saved


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    plan_file: Optional[Path] = typer.Argument(None, metavar="[PLAN]", help="Plan YAML to execute."),
    jobs_file: Optional[Path] = typer.Option(None, "--jobs", "-j", help="Jobs YAML (with workload blocks)."),
    topology: Optional[str] = typer.Option(None, "--topology", "-t", help="Topology file or preset (default: the plan's)."),
    iterations: int = typer.Option(5, "--iterations", "-n", min=1, help="Iterations per job."),
    device_map: Optional[str] = typer.Option(None, "--map", help=MAP_HELP),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for records, metrics, checkpoints, journal."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run journaled in this folder."),
    seed: int = typer.Option(0, "--seed", "-s", help="Base seed of the jobs' workloads."),
    threads: int = typer.Option(1, "--threads", min=1, help="Torch threads per CPU worker."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Skip the PNG and HTML pictures."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
    backend: Optional[str] = typer.Option(None, "--backend", help="local (worker processes, the default) or ray "
                                          "(Ray actors, one placement group per node)."),
    address: Optional[str] = typer.Option(None, "--address", help="--backend ray: auto or HOST:PORT of a Ray "
                                          "cluster's head (default: a private Ray instance for this run)."),
    replan: bool = typer.Option(True, "--replan/--no-replan", help="Detect drift on the measured phases, "
                                "refit and replan (switch at a cycle boundary)."),
    drift_threshold: float = typer.Option(0.15, "--drift-threshold", min=0.0, help="Drift when "
                                          "|EWMA(measured / profile) - 1| exceeds this for 5 iterations."),
    migration_cost: float = typer.Option(60.0, "--migration-cost", min=0.0,
                                         help="Seconds of its GPUs the planner charges a replan for moving a job."),
    static: bool = typer.Option(False, "--static", help="Ignore the plan's elastic rules: no long-tail migration, "
                                "no lending (each rollout runs on exactly its planned GPUs)."),
    no_check: bool = typer.Option(False, "--no-check", help="Run a plan that fails the plan checker (experts; "
                                  "the run record says so)."),
    connect_timeout: float = typer.Option(30.0, "--connect-timeout", min=1.0,
                                          help="--backend ray --address: give up joining the cluster after this long."),
    heartbeat_timeout: float = typer.Option(10.0, "--heartbeat-timeout", min=0.5,
                                            help="Kill and restart a worker whose heartbeat is silent this long "
                                                 "(a hung or stopped process)."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", min=0, max=65535,
                                               help="Serve Prometheus metrics on 127.0.0.1:PORT during the run."),
    metrics_linger: float = typer.Option(75.0, "--metrics-linger", min=0.0, max=86400.0,
                                         help="With --metrics-port: keep serving the final values up to S seconds "
                                              "after the run, until one scrape has read them (0: close with the run)."),
) -> None:
    """Run a plan on local workers: weave run PLAN --jobs J --out DIR [--map SPEC], or --resume DIR.
    With --backend ray [--address auto|HOST:PORT] the workers are Ray actors."""
    if resume is not None:
        saved = _saved_inputs(resume)
        if out is not None and out.resolve() != resume.resolve():
            raise InputError("<command line>", "--out", "--resume continues in its own folder; leave --out out")
        out = resume
        plan_file = Path(saved["plan"])
        jobs_file = Path(saved["jobs"])
        topology = saved["topology"]
        iterations = int(saved["iterations"])
        device_map = saved.get("map")
        seed = int(saved.get("seed", 0))
        threads = int(saved.get("threads", 1))
        backend = backend or saved.get("backend", "local")
        address = address if address is not None else saved.get("address")
        replan = bool(saved.get("replan", False))
        drift_threshold = float(saved.get("drift_threshold", drift_threshold))
        migration_cost = float(saved.get("migration_cost", migration_cost))
        no_check = no_check or bool(saved.get("no_check", False))
        static = static or bool(saved.get("static", False))
    if plan_file is None:
        raise InputError("<command line>", "PLAN", "required (or --resume DIR)")
    if jobs_file is None:
        raise InputError("<command line>", "--jobs", "required: the jobs' workloads are what the workers run")
    if out is None:
        raise InputError("<command line>", "--out", "required: the folder for records, checkpoints and the journal")
    from weave_rl.core.yamlio import check_output_dir
    from weave_rl.executor.ray_backend.cluster import check_backend_options

    backend = check_backend_options(backend or "local", address, device_map)  # before any folder is made
    check_output_dir(out, "--resume" if resume is not None else "--out")
    from weave_rl.executor.inputs import load_run_inputs

    plan, topo, jobs = load_run_inputs(plan_file, jobs_file, topology, check=not no_check)
    from weave_rl.executor.local.devices import map_devices

    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    devices = map_devices(gpus, device_map)
    inputs = None
    if resume is None:
        out.mkdir(parents=True, exist_ok=True)
        # The run folder keeps copies of its inputs, so --resume needs nothing else. The jobs are
        # saved as checked (workload paths made absolute), so a resume finds the same files.
        if plan_file.resolve() != (out / "plan.yaml").resolve():
            shutil.copyfile(plan_file, out / "plan.yaml")
        if jobs_file.resolve() != (out / "jobs.yaml").resolve():
            from weave_rl.profiles.jobs import save_jobs

            save_jobs(jobs, out / "jobs.yaml")
        from weave_rl.planner.plan import plan_topology_ref

        topo_ref = topology or plan_topology_ref(plan, plan_file) or plan.topology
        if Path(str(topo_ref)).exists():
            shutil.copyfile(topo_ref, out / "topology.yaml")
            topo_ref = str((out / "topology.yaml").resolve())
        inputs = {"plan": str((out / "plan.yaml").resolve()), "jobs": str((out / "jobs.yaml").resolve()),
                  "topology": topo_ref, "iterations": iterations, "map": device_map, "seed": seed,
                  "threads": threads, "replan": replan, "drift_threshold": drift_threshold,
                  "migration_cost": migration_cost, "no_check": no_check, "static": static}
    if inputs is not None:
        inputs.update({"backend": backend, "address": address})
    from weave_rl.executor.local.backend import WorkerError
    from weave_rl.executor.local.run import DriftOptions

    setup = None
    servers: list = []  # the --metrics-port server, closed after --metrics-linger
    if metrics_port is not None:
        from weave_rl.executor.monitoring import metrics_setup

        setup = metrics_setup(metrics_port, announce=lambda url: err_console.print(f"metrics on {url}",
                                                                                   highlight=False), servers=servers)

    run_plan = _runner(backend, address, connect_timeout)
    from weave_rl.executor.config import ElasticRules

    try:
        rules = ElasticRules.off() if static else ElasticRules.from_plan(plan.elastic)
    except ValueError as exc:
        raise InputError(str(plan_file), "elastic", str(exc)) from None
    progress, bar = _progress(not as_json, iterations * len(plan.jobs))
    try:
        result = run_plan(plan, topo, jobs, out, iterations=iterations, devices=devices, seed=seed,
                                threads=threads, resume=resume is not None, inputs=inputs, progress=progress,
                                setup=setup, heartbeat_timeout_s=heartbeat_timeout, rules=rules,
                                drift=DriftOptions(threshold=drift_threshold, migration_cost_s=migration_cost)
                                if replan else None)
    except InputError:
        raise  # a user mistake found on the way (e.g. --address): the one-line error, exit 2
    except Exception as exc:  # noqa: BLE001  a workload bug, a library's error: shown verbatim, never markup
        if bar is not None:
            bar.stop()
            bar = None
        _run_failed(exc, out, internal=not isinstance(exc, WorkerError))
        raise typer.Exit(1) from None
    finally:
        if bar is not None:
            bar.stop()
    if result.controller is None:
        console.print(f"every job had already finished its {iterations} iterations; {out} is unchanged")
        return
    devices = dict(result.backend.devices)  # where the workers ran (Ray: ray_placement.json has the nodes)
    data = write_run_outputs(out, result, plots=not no_plots, inputs={
        "plan": str(plan_file), "jobs": str(jobs_file), "topology": topo.name, "iterations": iterations,
        "map": devices, "seed": seed, "resumed": result.resumed, "replan": replan,
        "drift_threshold": drift_threshold if replan else None, "plan_checked": not no_check},
        elastic=rules.elastic)
    if as_json:
        print_json({k: v for k, v in data.items() if k not in ("per_job", "log")})
    else:
        _summary(data, result, out)
    if servers:
        from weave_rl.executor.monitoring import linger_and_close

        linger_and_close(servers, metrics_linger, lambda text: err_console.print(text, highlight=False))


def _runner(backend: str, address: str | None, connect_timeout: float):
    """The run call for ``--backend`` (``run_plan_local``'s signature): the one place that reads the
    name; the loop, journal, elastic rules and drift are the same for every backend."""
    if backend == "ray":
        from weave_rl.executor.ray_backend.run import runner

        return runner(address, connect_timeout)  # Ray actors as the workers' transport
    from weave_rl.executor.local.run import run_plan_local

    return run_plan_local


def _run_failed(exc: BaseException, out: Path, *, internal: bool) -> None:
    """The error as it was raised (workers' and libraries' texts contain ``[...]``: printed as plain
    text, never as markup) and the way to continue; an unexpected error's traceback goes to a file."""
    import traceback

    err_console.print("error: ", style="bold red", end="", highlight=False)
    err_console.print(str(exc) if not internal else f"{type(exc).__name__}: {exc}", markup=False,
                      highlight=False, soft_wrap=True)
    if internal:
        trace = out / "controller-error.txt"
        try:
            trace.write_text("".join(traceback.format_exception(exc)))
            err_console.print(f"traceback: {trace}", markup=False, highlight=False, soft_wrap=True)
        except OSError:
            pass
    err_console.print(f"the journal in {out} keeps the completed iterations: weave run --resume {out}",
                      markup=False, highlight=False, soft_wrap=True)


def write_run_outputs(out: Path, result, *, plots: bool, inputs: dict, elastic: bool = False) -> dict:
    """records, metrics.json, job_metrics.csv and the pictures; returns the metrics."""
    from weave_rl.executor.outputs import metrics, records_table, write_outputs

    controller = result.controller
    out.mkdir(parents=True, exist_ok=True)
    data = metrics(controller, wall_s=result.wall_s, events=len(controller.records))
    data["backend"] = getattr(result.backend, "name", "local")
    data["elastic"] = elastic
    data["workers"] = result.events
    data["permit_latency"] = result.permit_latency
    data["replans"] = getattr(result, "replans", [])
    data["drift_detections"] = getattr(result, "detections", [])
    data["inputs"] = inputs
    write_outputs(out, controller, data)
    _write_job_metrics(out / "job_metrics.csv", result.job_rows)
    if plots:
        from weave_rl.executor.plots import draw_all

        frame = records_table(controller)
        cycles = [g.cycle_s for g in controller.plan.groups]
        marks = [(e["t"], e["event"]) for e in result.events if e.get("event") == "worker_died"]
        draw_all(out, frame, controller.held_timeline, controller.now, cycle_hint=max(cycles) if cycles else None,
                 marks=marks[:50])
    from weave_rl.executor.outputs import json_safe

    return json_safe(data)


def _write_job_metrics(path: Path, rows: list[dict]) -> None:
    first = ["job", "iteration", "mean_reward", "reward_mean", "loss", "samples", "tokens", "trained_samples",
             "ledger", "ledger_unique", "rollout_s", "train_s", "sync_s", "sync_bytes"]
    keys = [k for k in first if any(k in r for r in rows)]
    keys += sorted({k for r in rows for k in r} - set(keys))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys or first)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def _progress(enabled: bool, total: int):
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("running"), BarColumn(), MofNCompleteColumn(), TextColumn("t={task.fields[t]:,.1f} s"),
                   TimeElapsedColumn(), console=err_console, transient=True)
    task = bar.add_task("run", total=total, t=0.0)
    bar.start()

    def update(done: int, _total: int, t: float) -> None:
        bar.update(task, completed=done, t=t)

    return update, bar


def _fmt(x, digits=3):
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return round(x, digits) if isinstance(x, float) else x


def _summary(data: dict, result, out: Path) -> None:
    lat = data.get("permit_latency") or {}
    console.print(f"ran {data['iterations']} iterations of {data['jobs']} jobs in {data['wall_s']:.1f} s "
                  f"(run time {data['horizon_s']:.2f} s); permit latency p50 {_fmt(lat.get('p50_ms'), 2)} ms, "
                  f"p99 {_fmt(lat.get('p99_ms'), 2)} ms; worker restarts "
                  f"{sum(1 for e in result.events if e.get('event') == 'worker_died')}", highlight=False)
    last: dict[str, dict] = {}
    for r in result.job_rows:
        last[r["job"]] = r
    rows = []
    for name, j in sorted(data["per_job"].items()):
        lr = last.get(name, {})
        reward = lr.get("mean_reward", lr.get("reward_mean"))
        rows.append([name, j["iterations"], _fmt(j["planned_iteration_s"]), _fmt(j["steady_iteration_s"]),
                     _fmt(j["iteration_s"]), _fmt(reward), _fmt(lr.get("loss"))])
    console.print(table("Jobs", ["job", "iters", "plan s", "steady s", "mean s", "last reward", "last loss"], rows))
    for r in data.get("replans", []):
        console.print(f"replan at {r['t']:,.1f} s: {r['reason']}; ${_fmt(r['usd_per_hour_before'])}/h -> "
                      f"${_fmt(r['usd_per_hour_after'])}/h; moved {', '.join(r['moved']) or 'none'}", highlight=False)
    console.print(f"wrote records, metrics.json, job_metrics.csv and pictures to {out}")
