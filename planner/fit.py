"""Checks that need both the topology and the jobs: can each job's phases fit on some cluster?"""

from __future__ import annotations

from dataclasses import dataclass

from weave_rl.profiles.jobs import JobSet
from weave_rl.topology.topology import Topology
from weave_rl.core.errors import InputError


@dataclass(frozen=True)
class FitProblem:
    job_index: int
    job: str
    key: str  # key path inside the jobs file, e.g. jobs[2].rollout.gpus
    reason: str


def job_fit_problems(jobs: JobSet, topology: Topology) -> list[FitProblem]:
    """Phases narrower than no cluster of an allowed type, and state larger than any node's host memory."""
    problems: list[FitProblem] = []
    for i, job in enumerate(jobs.jobs):
        for kind in ("rollout", "train"):
            phase = getattr(job, kind)
            clusters = [c for c in topology.clusters.values() if c.gpu_type in phase.gpu_types]
            if not clusters:
                problems.append(FitProblem(i, job.name, f"jobs[{i}].{kind}.gpu_types",
                                           f"no cluster of topology {topology.name!r} has GPU type "
                                           f"{' or '.join(phase.gpu_types)}"))
                continue
            widest = max(clusters, key=lambda c: c.nodes * c.gpus_per_node)
            width = widest.nodes * widest.gpus_per_node
            narrowest = min(phase.gpu_options)
            if narrowest > width:
                problems.append(FitProblem(i, job.name, f"jobs[{i}].{kind}.gpus",
                                           f"{narrowest} GPUs is wider than every cluster of type "
                                           f"{' or '.join(phase.gpu_types)} (largest: {widest.name}, {width} GPUs)"))
            roomiest = max(c.host_mem_gb for c in clusters)
            if phase.host_mem_gb > roomiest:
                problems.append(FitProblem(i, job.name, f"jobs[{i}].{kind}.host_mem_gb",
                                           f"{phase.host_mem_gb:g} GB of state exceeds every node's host memory "
                                           f"(largest: {roomiest:g} GB)"))
    return problems


def require_jobs_fit(jobs: JobSet, topology: Topology, jobs_file: str) -> None:
    problems = job_fit_problems(jobs, topology)
    if problems:  # every job that does not fit, one line each
        raise InputError.many([(jobs_file, p.key, p.reason) for p in problems])
