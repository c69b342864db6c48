"""The ``weave`` command line: parse, call a library function, render. Errors exit 2 without a traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from weave import __version__
from weave.errors import InputError
from weave.render import console, err_console, print_json, table

app = typer.Typer(help="Weave: co-scheduling plans for disaggregated RL post-training.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
topology_app = typer.Typer(help="Cluster topologies (files and presets).", no_args_is_help=True)
jobs_app = typer.Typer(help="Job specs: show and generate workloads.", no_args_is_help=True)
profile_app = typer.Typer(help="Measured stage times -> job specs.", no_args_is_help=True)
app.add_typer(topology_app, name="topology")
app.add_typer(jobs_app, name="jobs")
app.add_typer(profile_app, name="profile")

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of tables.")


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
    from topology.topology import load_topology, topology_to_data

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
    from profiles.jobs import jobs_to_data, load_jobs
    from weave.inputs import require_jobs_fit

    q = _parse_quantile(quantile)
    topo = None
    if topology:
        from topology.topology import load_topology

        topo = load_topology(topology)
    jobs = load_jobs(file, topo.gpu_types) if topo else load_jobs(file)
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
def jobs_generate(family: str = typer.Argument(..., help="micro | BL | RH | TH | Mixed | seed"),
                  count: int = typer.Option(8, "--count", "-n", min=1, help="Number of jobs."),
                  seed: int = typer.Option(0, "--seed", "-s", help="Random seed."),
                  out: Path = typer.Option(..., "-o", "--out", help="Jobs YAML to write.")) -> None:
    """Generate a reference workload (Weave micro-benchmarks, synthetic families, the seed job)."""
    from profiles.generators import FAMILIES, generate
    from profiles.jobs import save_jobs

    if family not in FAMILIES:
        raise InputError("<command line>", "FAMILY", f"unknown family {family!r} (families: {', '.join(FAMILIES)})")
    jobs = generate(family, count, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_jobs(jobs, out)
    console.print(f"wrote {len(jobs.jobs)} {family} jobs (seed {seed}) to {out}")


# ----- profile --------------------------------------------------------------------------------
@profile_app.command("fit")
def profile_fit(records: Path = typer.Argument(..., metavar="RECORDS", help="Measured records, CSV or parquet."),
                jobs_file: Path = typer.Option(..., "--jobs", "-j", help="Jobs YAML to update."),
                out: Path = typer.Option(..., "-o", "--out", help="Updated jobs YAML to write.")) -> None:
    """Refit job profiles from measured records (DESIGN 3.4)."""
    from profiles.fit import fit_jobs
    from profiles.jobs import load_jobs, save_jobs
    from profiles.records import read_records

    jobs = load_jobs(jobs_file)
    frame = read_records(records)
    fitted = fit_jobs(frame, jobs, records_file=str(records))
    out.parent.mkdir(parents=True, exist_ok=True)
    save_jobs(fitted, out)
    console.print(f"fitted {len(frame)} records onto {len(fitted.jobs)} jobs; wrote {out}")


def _parse_quantile(text: str) -> float | str:
    if text == "max":
        return "max"
    try:
        q = float(text)
    except ValueError:
        q = -1.0
    if not 0 < q <= 1:
        raise InputError("<command line>", "--quantile", f"expected a number in (0, 1] or 'max', got {text!r}")
    return q


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes print one line and exit 2; usage errors keep the parser's exit 2."""
    try:
        app(args=argv, prog_name="weave", standalone_mode=True)
    except InputError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console-script wrapper: exit with main()'s code."""
    sys.exit(main())
