"""The inputs of a run on real workers: plan, topology and jobs, checked against each other.

Every problem is an ``InputError`` naming the file and the key, raised before any worker starts.
"""

from __future__ import annotations

from pathlib import Path

from weave_rl.core.errors import InputError
from weave_rl.executor.workload import OptionError, check_workload
from weave_rl.planner.check import require_valid
from weave_rl.planner.plan import Plan, load_plan
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
    if not plan.groups:
        raise InputError(str(plan_file), "groups", "the plan places no job: nothing to run")
    missing = [j for j in plan.jobs if j not in jobs.names]
    if missing:
        raise InputError(str(jobs_file), "jobs", f"plan job {missing[0]!r} is not in the jobs file")
    for gi, group in enumerate(plan.groups):
        for ji, jp in enumerate(group.jobs):
            for si, slot in enumerate(jp.phases):
                for g in slot.gpus:
                    node, _, _ = g.rpartition(":")
                    if node not in topo.nodes or g not in topo.node(node).gpu_ids:
                        raise InputError(str(plan_file), f"groups[{gi}].jobs[{ji}].phases[{si}].gpus",
                                         f"unknown GPU {g!r} in topology {topo.name!r}")
    # The jobs' workloads, checked here in the controller (kind importable, options valid, files
    # there), so a bad one is one line naming the jobs file and key before any worker starts. The
    # workers get the checked blocks (relative paths made absolute against the jobs file's folder).
    base = jobs_file.resolve().parent
    checked = []
    for i, job in enumerate(jobs.jobs):
        if job.name not in plan.jobs:
            checked.append(job)
            continue
        try:
            block = check_workload(job.workload, base)
        except OptionError as exc:
            raise InputError(str(jobs_file), f"jobs[{i}].workload.{exc.key}", exc.reason) from None
        except ValueError as exc:
            raise InputError(str(jobs_file), f"jobs[{i}].workload.kind", str(exc)) from None
        checked.append(job if block == job.workload else job.model_copy(update={"workload": block}))
    jobs = jobs.model_copy(update={"jobs": tuple(checked)})
    if check:
        require_valid(plan, topo, jobs, str(plan_file))
    return plan, topo, jobs
