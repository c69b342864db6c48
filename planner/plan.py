"""The Plan (DESIGN 3.3): a plain serializable value written by every policy and read by the executor.

Timetable semantics (what the validator in ``planner/check.py`` enforces):
- Each group repeats a timetable of period ``cycle_s``. Every job runs exactly one rollout, one train
  and one sync per cycle; ``start_s`` is an offset in ``[0, cycle_s)`` and a phase may wrap past the
  end of the cycle (intervals are taken modulo the cycle).
- ``rollout`` and ``train`` hold their ``gpus``; on a GPU that hosts two or more distinct (job, role)
  phases, each phase is preceded by its warm-switch time (state bytes per GPU / host<->GPU bandwidth),
  and that gap may not overlap another phase either.
- ``sync`` holds no GPU time; its ``gpus`` name the receivers (the job's rollout GPUs).
- Chain: rollout -> train -> sync -> the next rollout. Walking around the circle from each phase's
  end to the next phase's start, one loop rollout->train->sync->rollout takes ``k * cycle_s`` with
  ``1 <= k <= 1 + max_staleness`` (a one-step off-policy job may start its next rollout before its
  previous training and sync are done).
- ``iteration_s == cycle_s`` (one iteration per cycle) and ``iteration_s <= slo * solo_iteration_s``.
- A phase's GPU count and type come from its ``gpu_options`` / ``gpu_types``; the ``colocate``
  baseline (veRL-style) is the one exception: it runs each rollout on the job's training GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from weave_rl.core.errors import InputError, from_validation_error
from weave_rl.core.yamlio import dump_yaml, load_yaml_file

PhaseName = Literal["rollout", "train", "sync"]
POLICIES = ("optimal", "weave", "solo", "colocate")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PhaseSlot(_Frozen):
    phase: PhaseName
    start_s: float = Field(ge=0)
    duration_s: float = Field(ge=0)
    gpus: list[str] = Field(min_length=1)
    gpu_type: str | None = None  # filled by the planner; the checker derives it from the topology anyway

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class JobPlan(_Frozen):
    name: str
    solo_iteration_s: float = Field(gt=0)
    iteration_s: float = Field(gt=0)
    slo: float | None = None
    phases: list[PhaseSlot]

    def phase(self, name: str) -> PhaseSlot:
        for slot in self.phases:
            if slot.phase == name:
                return slot
        raise KeyError(f"job {self.name} has no {name} phase")

    @property
    def slowdown(self) -> float:
        return self.iteration_s / self.solo_iteration_s

    @property
    def nodes(self) -> list[str]:
        return sorted({g.rpartition(":")[0] for s in self.phases if s.phase != "sync" for g in s.gpus})


class GroupPlan(_Frozen):
    name: str
    cycle_s: float = Field(gt=0)
    nodes: list[str] = Field(min_length=1)
    jobs: list[JobPlan] = Field(min_length=1)
    usd_per_hour: float | None = None


class SolverInfo(_Frozen):
    name: str
    status: str
    wall_s: float = 0.0
    gap: float | None = None
    objective: float | None = None
    bound: float | None = None
    note: str | None = None


class Rejection(_Frozen):
    name: str
    reason: str


class Plan(_Frozen):
    version: int = 1
    policy: str
    objective: Literal["cost", "iteration-time"] = "cost"
    quantile: float | Literal["max"] = 0.95
    topology: str
    cost_usd_per_hour: float = Field(ge=0)
    lower_bound_usd_per_hour: float | None = None
    solver: SolverInfo
    groups: list[GroupPlan] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
    elastic: dict[str, Any] = Field(default_factory=dict)

    @property
    def jobs(self) -> dict[str, tuple[GroupPlan, JobPlan]]:
        return {job.name: (group, job) for group in self.groups for job in group.jobs}

    @property
    def nodes(self) -> list[str]:
        return [n for g in self.groups for n in g.nodes]


DEFAULT_ELASTIC = {
    "long_tail_migration": {"threshold": 0.8, "target_share": 0.25},
    "lend_idle_gpus": True,
}


def plan_to_data(plan: Plan) -> dict:
    return plan.model_dump(mode="json", exclude_none=True)


def save_plan(plan: Plan, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml(plan_to_data(plan)))


def load_plan(path: str | Path) -> Plan:
    data = load_yaml_file(path)
    return plan_from_data(data, str(path))


def plan_from_data(data: Any, source: str = "<plan>") -> Plan:
    if not isinstance(data, dict):
        raise InputError(source, None, "expected a mapping (a Weave plan)")
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(source, exc) from None
