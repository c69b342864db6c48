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
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from weave_rl.core.errors import InputError, from_validation_error
from weave_rl.core.yamlio import dump_yaml, load_yaml_file, write_text_file

PhaseName = Literal["rollout", "train", "sync"]
POLICIES = ("optimal", "weave", "solo", "colocate")


PLAN_VERSION = 1
_MAX_S = 1e9  # no plan's time reaches 30 years; bounded so that sums of them stay finite

def _number(value: Any) -> Any:
    if isinstance(value, (bool, str)):
        raise ValueError("expected a number")
    return value


# Numbers in a plan are finite and neither bools (``start_s: true`` is no time) nor strings.
_Num = Annotated[float, BeforeValidator(_number)]
Seconds = Annotated[_Num, Field(ge=0, le=_MAX_S)]
PosSeconds = Annotated[_Num, Field(gt=0, le=_MAX_S)]
Number = _Num
Text = Annotated[str, Field(min_length=1, strict=True)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PhaseSlot(_Frozen):
    phase: PhaseName
    start_s: Seconds
    duration_s: Seconds
    gpus: list[Text] = Field(min_length=1)
    gpu_type: str | None = None  # filled by the planner; the checker derives it from the topology anyway

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class JobPlan(_Frozen):
    name: Text
    solo_iteration_s: PosSeconds
    iteration_s: PosSeconds
    slo: Annotated[_Num, Field(gt=0, le=1e6)] | None = None
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


def circular_gap(end: float, start: float, cycle: float, tol: float = 1e-6) -> float:
    """Time walking forward around the circle from ``end`` to ``start``, in ``[0, cycle)``.

    A phase that ends exactly where the next starts leaves a gap of 0, not a whole cycle, also
    after floating round-off.
    """
    gap = (start - end) % cycle
    if gap > cycle - tol:
        gap = 0.0
    return gap


def chain_offsets(slots: Mapping[str, Any], cycle_s: float) -> dict[str, float]:
    """When each phase of an iteration is planned after its rollout starts (``slots``: the job's
    rollout, train and sync, with ``start_s`` and ``duration_s``): its train at the first offset
    ``train.start_s`` (mod the cycle) at or after the rollout's end, its sync likewise after the train."""
    r, t, s = slots["rollout"], slots["train"], slots["sync"]
    train = r.duration_s + circular_gap(r.start_s + r.duration_s, t.start_s, cycle_s)
    return {"rollout": 0.0, "train": train,
            "sync": train + t.duration_s + circular_gap(t.start_s + t.duration_s, s.start_s, cycle_s)}


class GroupPlan(_Frozen):
    name: Text
    cycle_s: PosSeconds
    nodes: list[Text] = Field(min_length=1)
    jobs: list[JobPlan] = Field(min_length=1)
    usd_per_hour: Number | None = None


class SolverInfo(_Frozen):
    name: str
    status: str
    wall_s: Number = 0.0
    gap: Number | None = None
    objective: Number | None = None
    bound: Number | None = None
    note: str | None = None


class Rejection(_Frozen):
    name: str
    reason: str


class Plan(_Frozen):
    version: int = PLAN_VERSION
    policy: Text
    objective: Literal["cost", "iteration-time", "throughput"] = "cost"
    quantile: Literal["max"] | Annotated[_Num, Field(gt=0, le=1)] = 0.95
    topology: Text
    # Where ``weave plan`` read the topology: a preset name, or the file's path relative to the plan
    # file's folder (optional; ``plan_topology_ref`` resolves it for plan export, simulate and run).
    topology_source: Text | None = None
    cost_usd_per_hour: Annotated[_Num, Field(ge=0)]
    lower_bound_usd_per_hour: Number | None = None
    solver: SolverInfo
    groups: list[GroupPlan] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
    elastic: dict[str, Any] = Field(default_factory=dict)

    @field_validator("version", mode="before")
    @classmethod
    def _known_version(cls, value: Any) -> Any:
        if isinstance(value, bool) or value != PLAN_VERSION:
            raise ValueError(f"unsupported plan version: this weave reads version {PLAN_VERSION}")
        return value

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
    write_text_file(path, dump_yaml(plan_to_data(plan)))


def load_plan(path: str | Path) -> Plan:
    return plan_from_data(load_yaml_file(path), str(path))


def plan_from_data(data: Any, source: str = "<plan>") -> Plan:
    if not isinstance(data, dict):
        raise InputError(source, None, "expected a mapping (a Weave plan)"
                         + (" (the file is empty)" if data is None else f" (got {type(data).__name__})"))
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(source, exc) from None


def topology_source_for(topology: str, plan_file: str | Path) -> str:
    """What a plan written to ``plan_file`` records for ``--topology topology``: a preset name as is,
    a file as its path relative to the plan file's folder (absolute when no relative path exists)."""
    import os

    path = Path(topology)
    if not path.is_file():
        return topology  # a preset (load_topology has accepted it already)
    try:
        return Path(os.path.relpath(path.resolve(), Path(plan_file).resolve().parent)).as_posix()
    except ValueError:  # another drive
        return str(path.resolve())


def plan_topology_ref(plan: Plan, plan_file: str | Path) -> str | None:
    """The topology to load for a saved plan: its ``topology_source`` (a preset, or a file resolved
    against the plan file's folder), else the plan's topology name when it is a preset, else None."""
    from weave_rl.topology.presets import PRESETS

    source = plan.topology_source
    if source:
        if source in PRESETS:
            return source
        path = Path(source)
        return str(path if path.is_absolute() else Path(plan_file).parent / path)
    return plan.topology if plan.topology in PRESETS else None


def topology_problems(plan: Plan, topology: Any, source: str = "<plan>") -> list:
    """``Problem`` s for every group node and phase GPU of ``plan`` that ``topology`` does not have
    (checked before anything looks them up)."""
    from weave_rl.core.errors import Problem

    out = []
    nodes = topology.nodes
    for gi, group in enumerate(plan.groups):
        for ni, node in enumerate(group.nodes):
            if node not in nodes:
                out.append(Problem(source, f"groups[{gi}].nodes[{ni}]",
                                   f"unknown node {node!r} in topology {topology.name!r}"))
        for ji, job in enumerate(group.jobs):
            for si, slot in enumerate(job.phases):
                bad = [g for g in slot.gpus if g.rpartition(":")[0] not in nodes
                       or g not in nodes[g.rpartition(":")[0]].gpu_ids]
                if bad:
                    shown = ", ".join(map(repr, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                    out.append(Problem(source, f"groups[{gi}].jobs[{ji}].phases[{si}].gpus",
                                       f"GPU{'s' if len(bad) > 1 else ''} {shown} not in topology {topology.name!r}"))
    return out
