"""The planning model every policy and the checker share (DESIGN section 4), independent of any solver.

- phase durations at the plan's quantile on a GPU count and type (profiles' scaling rule);
- warm-switch time: a phase's per-node host state spread over the node's GPUs, over PCIe;
- weight sync: the topology's two-stage model between the job's train and rollout GPUs;
- the solo placement and solo iteration time that SLOs are measured against (each phase rounded
  up to whole milliseconds, the resolution of every timetable).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import cached_property

from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import Topology, node_of

SYNC_MODEL = "two_stage"


class PlanningModel:
    def __init__(self, topology: Topology, jobs: JobSet, quantile: float | str = 0.95):
        self.topology = topology
        self.jobs = jobs
        self.quantile = quantile
        self._sync_cache: dict[tuple, float] = {}
        self._solo_cache: dict[str, float] = {}
        self._switch_cache: dict[tuple[float, str], float] = {}

    # ----- durations ---------------------------------------------------------------------
    def duration(self, job: JobSpec, kind: str, gpus: int, gpu_type: str) -> float:
        return job.phase(kind).duration_at(self.quantile, gpus, gpu_type, self.topology.gpu_types)

    def switch_s(self, job: JobSpec, kind: str, node_id: str) -> float:
        """Warm start of ``job``'s ``kind`` state on one GPU of ``node_id``."""
        key = (job.phase(kind).host_mem_gb, node_id)  # all it depends on
        if key not in self._switch_cache:
            node = self.topology.node(node_id)
            self._switch_cache[key] = self.topology.warm_switch_s(key[0] * 1e9 / node.gpus, node_id)
        return self._switch_cache[key]

    def max_switch_s(self, job: JobSpec, kind: str, gpus: list[str]) -> float:
        return max((self.switch_s(job, kind, n) for n in {node_of(g) for g in gpus}), default=0.0)

    def sync_s(self, job: JobSpec, train_gpus: list[str], rollout_gpus: list[str]) -> float:
        # Sync time depends only on how many GPUs sit on which nodes; cache by that shape.
        key = (job.weight_bytes, _shape(self.topology, train_gpus), _shape(self.topology, rollout_gpus),
               tuple(sorted(set(map(node_of, train_gpus)) & set(map(node_of, rollout_gpus)))))
        if key not in self._sync_cache:
            self._sync_cache[key] = self.topology.sync_time_s(job.weight_bytes, train_gpus, rollout_gpus, SYNC_MODEL)
        return self._sync_cache[key] + job.sync_overhead_s  # the measured part the network model leaves out

    # ----- solo reference --------------------------------------------------------------------
    def solo_placement(self, job: JobSpec) -> tuple[list[str], list[str]]:
        """Rollout and train GPUs of ``job`` alone at its reference config: first nodes of a cluster of
        each phase's type, rollout first, train on the next free GPUs when both share a cluster."""
        used: dict[str, int] = {}
        out = []
        for kind in ("rollout", "train"):
            phase = job.phase(kind)
            types = [phase.gpu_type, *[t for t in phase.gpu_types if t != phase.gpu_type]]
            cluster = next((c for t in types for c in self.topology.clusters.values() if c.gpu_type == t), None)
            if cluster is None:
                raise ValueError(f"job {job.name}: no cluster with GPU type {phase.gpu_type}")
            gpu_ids = self.topology.gpus_in(cluster=cluster.name)
            start = used.get(cluster.name, 0)
            if start + phase.gpus > len(gpu_ids):
                start = 0  # not enough room for both: reuse (the solo reference is only a time estimate)
            out.append(gpu_ids[start:start + phase.gpus])
            used[cluster.name] = start + phase.gpus
        return out[0], out[1]

    def solo_iteration_s(self, job: JobSpec) -> float:
        rollout_gpus, train_gpus = self.solo_placement(job)
        r_type = self.topology.gpu_type_of(rollout_gpus[0])
        t_type = self.topology.gpu_type_of(train_gpus[0])
        # Each phase rounded up to whole milliseconds, the resolution of every timetable.
        return (ceil_ms(self.duration(job, "rollout", len(rollout_gpus), r_type))
                + ceil_ms(self.duration(job, "train", len(train_gpus), t_type))
                + ceil_ms(self.sync_s(job, train_gpus, rollout_gpus)))

    def solo_of(self, job: JobSpec) -> float:
        """Cached solo iteration time (also for jobs added after the model was built)."""
        if job.name not in self._solo_cache:
            self._solo_cache[job.name] = self.solo_iteration_s(job)
        return self._solo_cache[job.name]

    @cached_property
    def solo(self) -> dict[str, float]:
        return {job.name: self.solo_of(job) for job in self.jobs.jobs}


def ceil_ms(seconds: float) -> float:
    """Round a duration up to whole milliseconds (plans are solved and written at that resolution)."""
    return math.ceil(seconds * 1000 - 1e-6) / 1000


def _shape(topology: Topology, gpus: list[str]) -> tuple:
    counts = Counter(map(node_of, gpus))
    return tuple(sorted((topology.node(n).cluster, c) for n, c in counts.items()))
