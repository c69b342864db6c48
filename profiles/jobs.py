"""Job specs (DESIGN 3.2): what each RL job needs per phase, read from and written to jobs YAML.

A phase's ``duration_s`` is measured at one *reference point* (its ``gpus`` on its ``gpu_type``).
``PhaseSpec.duration_at`` moves it to another GPU count and type:

    duration = duration_s.quantile(q) * count factor * type factor

- count factor: with a ``scaling`` table, ``T(g) / T(gpus)`` where ``T`` is the table
  interpolated piecewise-linearly in ``1/g`` (exact at the table's points; outside the table,
  ``1/g`` scaling from the nearest point); without one, ``gpus / g`` (linear in 1/g).
- type factor: rollout is memory-bandwidth bound, so ``ref.hbm_tbps / new.hbm_tbps``; train is
  compute bound, so ``ref.tflops_bf16 / new.tflops_bf16``.

Each phase knows its ``kind`` (``rollout`` or ``train``). It is not a YAML key: ``JobSpec`` sets it
from where the phase sits, so ``job.rollout.duration_at(q, gpus, gpu_type, catalog)`` needs nothing
more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from weave_rl.profiles.durations import MAX_DURATION_S, Duration, _num
from weave_rl.topology.catalog import BUILTIN_GPU_TYPES, GpuType
from weave_rl.core.errors import InputError, Problems, validation_problems
from weave_rl.core.yamlio import dump_yaml, load_yaml_file, write_text_file

PHASES = ("rollout", "train")

_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
# Numbers are strict (``gpus: true`` is no GPU count), finite and bounded far past any real job, so
# that no product of them overflows downstream.
MAX_GPUS = 100_000
PosInt = Annotated[int, Field(gt=0, le=MAX_GPUS, strict=True)]
PosFloat = Annotated[float, Field(gt=0, le=1e6, strict=True)]
NonNegFloat = Annotated[float, Field(ge=0, le=1e7, strict=True)]
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S, strict=True)]
Name = Annotated[str, Field(min_length=1, strict=True)]


class Scaling(BaseModel):
    """Measured durations at several GPU counts (same reference GPU type as the phase)."""

    model_config = _CONFIG

    gpus: Annotated[tuple[PosInt, ...], Field(min_length=1)]
    duration_s: Annotated[tuple[Seconds, ...], Field(min_length=1)]

    @model_validator(mode="after")
    def _check(self) -> Scaling:
        if len(self.gpus) != len(self.duration_s):
            raise ValueError(f"gpus and duration_s differ in length ({len(self.gpus)} vs {len(self.duration_s)})")
        if any(a >= b for a, b in zip(self.gpus, self.gpus[1:])):
            raise ValueError("gpus must be strictly increasing")
        return self

    def time_at(self, gpus: int) -> float:
        """The table's duration at ``gpus``: piecewise linear in 1/g inside, 1/g scaling outside."""
        if gpus <= 0:
            raise ValueError(f"gpus must be > 0, got {gpus}")
        table = list(zip(self.gpus, self.duration_s))
        if gpus <= table[0][0]:
            g0, t0 = table[0]
            return t0 * g0 / gpus
        if gpus >= table[-1][0]:
            g1, t1 = table[-1]
            return t1 * g1 / gpus
        for (g0, t0), (g1, t1) in zip(table, table[1:]):
            if g0 <= gpus <= g1:
                w = (1 / gpus - 1 / g1) / (1 / g0 - 1 / g1)  # 1 at g0, 0 at g1
                return t1 + w * (t0 - t1)
        raise AssertionError("unreachable")

    def to_raw(self) -> dict:
        return {"gpus": list(self.gpus), "duration_s": [_num(d) for d in self.duration_s]}


class PhaseSpec(BaseModel):
    """One phase (rollout or train) of a job at its reference point, plus the planner's choices."""

    model_config = _CONFIG

    kind: Literal["rollout", "train"]
    gpus: PosInt
    gpu_type: Name
    duration_s: Duration
    host_mem_gb: NonNegFloat = 0.0
    scaling: Scaling | None = None
    gpu_options: Annotated[tuple[PosInt, ...], Field(min_length=1)] | None = None  # None -> (gpus,)
    gpu_types: Annotated[tuple[Name, ...], Field(min_length=1)] | None = None  # None -> (gpu_type,)

    @model_validator(mode="after")
    def _defaults(self) -> PhaseSpec:
        # The options default to the reference point. Set once here, while the model is being
        # built (it is frozen afterwards), so that readers always see a tuple.
        if self.gpu_options is None:
            object.__setattr__(self, "gpu_options", (self.gpus,))
        if self.gpu_types is None:
            object.__setattr__(self, "gpu_types", (self.gpu_type,))
        return self

    def duration_at(
        self,
        q: float | str,
        gpus: int | None = None,
        gpu_type: str | None = None,
        catalog: Mapping[str, GpuType] = BUILTIN_GPU_TYPES,
        *,
        kind: str | None = None,
    ) -> float:
        """Duration at quantile ``q`` on ``gpus`` GPUs of ``gpu_type`` (defaults: the reference point).

        ``kind`` overrides the phase's own kind (rarely needed).
        """
        kind = kind or self.kind
        if kind not in PHASES:
            raise ValueError(f"kind must be rollout or train, got {kind!r}")
        gpus = self.gpus if gpus is None else gpus
        gpu_type = self.gpu_type if gpu_type is None else gpu_type
        if gpus <= 0:
            raise ValueError(f"gpus must be > 0, got {gpus}")
        base = self.duration_s.quantile(q)
        if self.scaling is not None:
            count = self.scaling.time_at(gpus) / self.scaling.time_at(self.gpus)
        else:
            count = self.gpus / gpus
        if gpu_type == self.gpu_type:
            speed = 1.0
        else:
            ref, new = _gpu(catalog, self.gpu_type), _gpu(catalog, gpu_type)
            speed = ref.hbm_tbps / new.hbm_tbps if kind == "rollout" else ref.tflops_bf16 / new.tflops_bf16
        return base * count * speed


class JobSpec(BaseModel):
    """One RL post-training job: model size, SLO, and its rollout and train phases."""

    model_config = _CONFIG

    name: Name
    params_b: PosFloat
    bytes_per_param: PosFloat = 2.0
    slo: PosFloat = 2.0  # SLO < 1 is legal here; the planner rejects it
    max_staleness: Literal[0, 1] = 0
    iterations: Annotated[int, Field(gt=0, le=10**9, strict=True)] | None = None
    arrival_s: Annotated[float, Field(ge=0, le=MAX_DURATION_S, strict=True)] = 0.0
    # Seconds a weight sync takes beyond the topology's network model (serialising, copying into the
    # engine); ``weave profile fit`` measures it from the records' sync rows.
    sync_overhead_s: NonNegFloat = 0.0
    rollout: PhaseSpec
    train: PhaseSpec
    # What the real executor runs for this job ({kind: grpo, ...}); the planner ignores it.
    workload: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _not_blank(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("name must not be blank")
        return name

    @field_validator("workload")
    @classmethod
    def _workload_kind(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and not isinstance(value.get("kind", "grpo"), str):
            raise ValueError("workload.kind must be a string (e.g. grpo)")
        return value

    @field_validator("max_staleness", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("max_staleness must be 0 or 1")
        return value

    @field_validator("rollout", "train", mode="before")
    @classmethod
    def _set_kind(cls, value: Any, info: ValidationInfo) -> Any:
        kind = info.field_name
        if isinstance(value, PhaseSpec):
            return value if value.kind == kind else value.model_copy(update={"kind": kind})
        if isinstance(value, dict):
            if "kind" in value:
                raise ValueError("unknown key 'kind' (a phase's kind is given by its place: rollout or train)")
            return {"kind": kind, **value}
        return value

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param

    def phase(self, name: str) -> PhaseSpec:
        """``"rollout"`` or ``"train"`` -> that phase."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r} (expected rollout or train)")
        return getattr(self, name)


class JobSet(BaseModel):
    """The jobs of one jobs file; names are unique."""

    model_config = _CONFIG

    jobs: tuple[JobSpec, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> JobSet:
        problem = _duplicate(self.jobs)
        if problem:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        return self

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self):  # type: ignore[override]  # iterate jobs, not pydantic fields
        return iter(self.jobs)

    def __getitem__(self, name: str) -> JobSpec:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [job.name for job in self.jobs]


# --- files -----------------------------------------------------------------------------------


def load_jobs(path: str | Path, gpu_types: Mapping[str, GpuType] = BUILTIN_GPU_TYPES) -> JobSet:
    """Read and check a jobs YAML file; every problem is an ``InputError`` naming file and key."""
    return jobs_from_data(load_yaml_file(path), str(path), gpu_types)


def jobs_from_data(data: Any, file: str, gpu_types: Mapping[str, GpuType] = BUILTIN_GPU_TYPES) -> JobSet:
    """Check parsed YAML (``{jobs: [...]}``) and build the ``JobSet``.

    Every problem of the file is gathered (all jobs, all keys; GPU types and repeated names are
    checked even in a job with other problems) and raised as one ``InputError``.
    """
    if not isinstance(data, dict):
        raise InputError(file, None, "expected a mapping with key 'jobs' at the top level"
                         + (" (the file is empty)" if data is None else f" (got {type(data).__name__})"))
    problems = Problems(file)
    for key in data:
        if key != "jobs":
            problems.add(str(key), "unknown key")
    if "jobs" not in data:
        problems.add("jobs", "required key is missing")
        problems.raise_if_any()
    raw_jobs = data["jobs"]
    if raw_jobs is None:
        raw_jobs = []
    if not isinstance(raw_jobs, list):
        problems.add("jobs", f"expected a list of jobs (got {type(raw_jobs).__name__})")
        problems.raise_if_any()
    jobs = []
    names: dict[str, int] = {}
    for i, raw in enumerate(raw_jobs):
        if not isinstance(raw, dict):
            problems.add(f"jobs[{i}]", f"expected a mapping (one job), got {type(raw).__name__}")
            continue
        try:
            jobs.append(JobSpec.model_validate(raw))
        except ValidationError as exc:
            problems.extend(validation_problems(file, exc, prefix=("jobs", i)))
        name = raw.get("name")
        if isinstance(name, str) and name.strip():
            if name in names:
                problems.add(f"jobs[{i}].name", f"duplicate job name {name!r} (also jobs[{names[name]}].name)")
            names.setdefault(name, i)
        for phase in PHASES:
            raw_phase = raw.get(phase)
            if not isinstance(raw_phase, dict):
                continue
            _check_type(problems, f"jobs[{i}].{phase}.gpu_type", raw_phase.get("gpu_type"), gpu_types)
            options = raw_phase.get("gpu_types")
            for k, t in enumerate(options if isinstance(options, list) else []):
                _check_type(problems, f"jobs[{i}].{phase}.gpu_types[{k}]", t, gpu_types)
    problems.raise_if_any()
    return JobSet(jobs=jobs)


def jobs_to_data(jobset: JobSet) -> dict:
    """The YAML form of a job set (defaults left out); ``jobs_from_data`` reads it back equal."""
    return {"jobs": [_job_to_data(job) for job in jobset.jobs]}


def save_jobs(jobset: JobSet, path: str | Path) -> None:
    write_text_file(path, dump_yaml(jobs_to_data(jobset)))


def phase_to_data(phase: PhaseSpec) -> dict:
    """The YAML form of one phase (no ``kind``; default options left out)."""
    out: dict[str, Any] = {
        "gpus": phase.gpus,
        "gpu_type": phase.gpu_type,
        "duration_s": phase.duration_s.to_raw(),
        "host_mem_gb": _num(phase.host_mem_gb),
    }
    if phase.scaling is not None:
        out["scaling"] = phase.scaling.to_raw()
    if phase.gpu_options != (phase.gpus,):
        out["gpu_options"] = list(phase.gpu_options)
    if phase.gpu_types != (phase.gpu_type,):
        out["gpu_types"] = list(phase.gpu_types)
    return out


def _job_to_data(job: JobSpec) -> dict:
    out: dict[str, Any] = {"name": job.name, "params_b": _num(job.params_b)}
    if job.bytes_per_param != 2.0:
        out["bytes_per_param"] = _num(job.bytes_per_param)
    out["slo"] = _num(job.slo)
    if job.max_staleness != 0:
        out["max_staleness"] = job.max_staleness
    if job.iterations is not None:
        out["iterations"] = job.iterations
    if job.arrival_s != 0:
        out["arrival_s"] = _num(job.arrival_s)
    if job.sync_overhead_s != 0:
        out["sync_overhead_s"] = _num(job.sync_overhead_s)
    out["rollout"] = phase_to_data(job.rollout)
    out["train"] = phase_to_data(job.train)
    if job.workload is not None:
        out["workload"] = dict(job.workload)
    return out


def _duplicate(jobs) -> tuple[str, str] | None:
    """(key, reason) for the first repeated job name, else None."""
    first: dict[str, int] = {}
    for i, job in enumerate(jobs):
        if job.name in first:
            return f"jobs[{i}].name", f"duplicate job name {job.name!r} (also jobs[{first[job.name]}].name)"
        first[job.name] = i
    return None


def _check_type(problems: Problems, key: str, name: Any, gpu_types: Mapping[str, GpuType]) -> None:
    """A problem for a GPU type name (a non-empty string; other values are the schema's to report) that
    the catalog does not know."""
    if isinstance(name, str) and name and name not in gpu_types:
        problems.add(key, f"unknown GPU type {name!r} (known: {', '.join(sorted(gpu_types))})")


def _gpu(catalog: Mapping[str, GpuType], name: str) -> GpuType:
    try:
        return catalog[name]
    except KeyError:
        raise ValueError(f"unknown GPU type {name!r} (known: {', '.join(sorted(catalog))})") from None
