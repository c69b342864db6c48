"""The inputs of a run on real workers: plan, topology and jobs, checked against each other.

Every problem is an ``InputError`` naming the file and the key, raised before any worker starts.
"""

from __future__ import annotations

from pathlib import Path

from weave_rl.core.errors import InputError, Problems
from weave_rl.executor.workload import OptionError, check_workload
from weave_rl.planner.check import require_valid
from weave_rl.planner.plan import Plan, load_plan, topology_problems
from weave_rl.profiles.jobs import JobSet, load_jobs
from weave_rl.topology.topology import Topology, load_topology


def load_run_inputs(plan_file: Path, jobs_file: Path, topology: str | None, *,
                    check: bool = True) -> tuple[Plan, Topology, JobSet]:
    """Plan, topology and jobs, checked against each other (``InputError`` naming file and key); with
    ``check`` the plan must also pass the independent plan checker (overlaps, chains, SLOs, memory)."""
    plan = load_plan(plan_file)
    if topology is None:
        from weave_rl.planner.plan import plan_topology_ref

        topology = plan_topology_ref(plan, plan_file)
        if topology is None:
            raise InputError("<command line>", "--topology", f"required (the plan's topology {plan.topology!r} "
                             "is not a preset and the plan records no topology file)")
    topo = load_topology(topology)
    jobs = load_jobs(jobs_file, topo.gpu_types)
    if plan.topology != topo.name:
        raise InputError(str(plan_file), "topology", f"plan is for {plan.topology!r}, topology is {topo.name!r}")
    problems = Problems(str(plan_file))  # every problem of the plan against the jobs and topology at once
    if not plan.groups:
        problems.add("groups", "the plan places no job: nothing to run")
    for name in plan.jobs:
        if name not in jobs.names:
            problems.add("jobs", f"plan job {name!r} is not in the jobs file", file=str(jobs_file))
    problems.extend(topology_problems(plan, topo, str(plan_file)))
    # The jobs' workloads, checked here in the controller (kind importable, options valid, files
    # there), so a bad one names the jobs file and key before any worker starts. The workers get the
    # checked blocks (relative paths made absolute against the jobs file's folder).
    base = jobs_file.resolve().parent
    checked = []
    for i, job in enumerate(jobs.jobs):
        if job.name not in plan.jobs:
            checked.append(job)
            continue
        try:
            block = check_workload(job.workload, base)
        except OptionError as exc:
            problems.add(f"jobs[{i}].workload.{exc.key}", exc.reason, file=str(jobs_file))
            continue
        except ValueError as exc:
            problems.add(f"jobs[{i}].workload.kind", str(exc), file=str(jobs_file))
            continue
        checked.append(job if block == job.workload else job.model_copy(update={"workload": block}))
    problems.raise_if_any()
    jobs = jobs.model_copy(update={"jobs": tuple(checked)})
    if check:
        require_valid(plan, topo, jobs, str(plan_file))
    return plan, topo, jobs
