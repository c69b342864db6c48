"""The shared record builder: per-step phase times of one job -> DESIGN 3.4 records.

Logs give durations, not timestamps, so ``start_s`` is rebuilt: the first logged step starts at
0, each step starts where the previous one ended (its logged step time when there is one, else the
sum of its phases), and inside a step the phases run in the framework's order with their warm
switch (``switch_s``) right before them, as the executor records it. An extra column
``source_line`` names the log line each row came from.

An *overlapped* step (an async trainer, OpenRLHF ``--train.async_enable``) is laid out from its end
instead: the step lasts its logged wall time ``step_s``, train and sync end with it, and the rollout
ends where train starts, so it may reach back into the previous step (generation of batch k runs
while batch k-1 trains). The whole timeline is shifted so that the first row starts at 0.
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
    overlapped: bool = False  # async trainer: the rollout overlaps the previous step (see module doc)


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

        if s.overlapped and s.step_s and s.step_s >= s.train_switch_s + s.train_s + s.sync_s:
            train_start = t + s.step_s - s.sync_s - s.train_s
            add("rollout", train_start - s.rollout_s, s.rollout_s, s.rollout_switch_s, s.tokens)
            cursor = add("train", train_start, s.train_s, s.train_switch_s)
            if s.sync_s > 0:
                add("sync", cursor, s.sync_s)
            t += s.step_s
            continue
        if s.sync_first and s.sync_s > 0:
            cursor = add("sync", cursor, s.sync_s)
        cursor = add("rollout", cursor + s.rollout_switch_s, s.rollout_s, s.rollout_switch_s, s.tokens)
        cursor = add("train", cursor + s.train_switch_s, s.train_s, s.train_switch_s)
        if not s.sync_first and s.sync_s > 0:
            cursor = add("sync", cursor, s.sync_s)
        t += max(cursor - t, s.step_s or 0.0)
    first = min((r["start_s"] for r in rows), default=0.0)
    if first < 0:  # an overlapped first rollout reaches before 0
        for r in rows:
            r["start_s"] = round(r["start_s"] - first, 6)
    return records_frame(rows, file)
