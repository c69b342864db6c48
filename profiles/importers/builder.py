"""The shared record builder: per-step phase times of one job -> DESIGN 3.4 records.

Logs give durations, not timestamps, so ``start_s`` is rebuilt: the first logged step starts at
0, each step starts where the previous one ended (its logged step time when there is one, else the
sum of its phases), and inside a step the phases run in the framework's order with their warm
switch (``switch_s``) right before them, as the executor records it. An extra column
``source_line`` names the log line each row came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from weave_rl.profiles.records import records_frame


@dataclass(frozen=True)
class StepPhases:
    """One step's time per Weave phase (seconds), as a framework importer maps it."""

    line: int
    step: int
    rollout_s: float
    train_s: float
    sync_s: float = 0.0  # 0: no sync row (the log has no weight-sync timer for this step)
    rollout_switch_s: float = 0.0
    train_switch_s: float = 0.0
    tokens: float | None = None  # generated (response) tokens of the rollout
    step_s: float | None = None  # the framework's own wall time of the whole step
    sync_first: bool = False  # ROLL pushes the weights at the start of its step, before the rollout


@dataclass(frozen=True)
class Placement:
    """GPU counts and types of one job's phases (sync lands on the rollout GPUs)."""

    rollout_gpus: int
    train_gpus: int
    rollout_gpu_type: str
    train_gpu_type: str


def build_records(job: str, steps: list[StepPhases], placement: Placement, file: str = "<log>") -> pd.DataFrame:
    rows: list[dict] = []
    t = 0.0
    for s in steps:
        cursor = t

        def add(phase: str, start: float, duration: float, switch: float = 0.0, tokens: float | None = None) -> float:
            gpus, gpu_type = ((placement.train_gpus, placement.train_gpu_type) if phase == "train"
                              else (placement.rollout_gpus, placement.rollout_gpu_type))
            rows.append({"job": job, "iteration": s.step, "phase": phase, "gpus": gpus, "gpu_type": gpu_type,
                         "start_s": round(start, 6), "duration_s": round(duration, 6), "switch_s": round(switch, 6),
                         "tokens": math.nan if tokens is None else float(tokens), "source_line": s.line})
            return start + duration

        if s.sync_first and s.sync_s > 0:
            cursor = add("sync", cursor, s.sync_s)
        cursor = add("rollout", cursor + s.rollout_switch_s, s.rollout_s, s.rollout_switch_s, s.tokens)
        cursor = add("train", cursor + s.train_switch_s, s.train_s, s.train_switch_s)
        if not s.sync_first and s.sync_s > 0:
            cursor = add("sync", cursor, s.sync_s)
        t += max(cursor - t, s.step_s or 0.0)
    return records_frame(rows, file)
