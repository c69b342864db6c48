"""The run's journal: what ``weave run --resume DIR`` needs after the controller itself died.

``DIR/run.json`` holds the inputs (the plan and jobs are copied into DIR, so a resume needs nothing
else); ``DIR/journal.jsonl`` gets one line per event, flushed as it happens:

- ``{"kind": "record", "row": {...}}``: a finished phase (DESIGN 3.4 row, real iteration numbers);
- ``{"kind": "iteration", "job", "iteration", "t"}``: an iteration completed (its weight sync done);
- ``{"kind": "metric", "row": {...}}``: a job's reward and loss for one iteration;
- ``{"kind": "event", ...}``: worker deaths and restarts;
- ``{"kind": "detection", ...}``: a job's phase drifted past the threshold (drift detector);
- ``{"kind": "replan", ...}``: a replan (time, job, reason, $/h before and after, jobs moved) and
  ``{"kind": "profile", "job", "spec"}``: the job's profile refit from its records for it;
- ``{"kind": "plan", "t", "reason", "plan"}``: a plan switch took effect (the plan in force from then
  on; the plan of ``run.json`` until the first);
- ``{"kind": "resume", "completed"}``: a resumed controller starts here. Rows written before it for
  iterations that had not completed then belong to an attempt that was abandoned (the iteration is
  re-run from its checkpoint): reading drops them at the marker, so however many times the run
  crashes and resumes, each phase of each iteration keeps exactly one record.

Checkpoints (``DIR/checkpoints/<job>/train-<k>.pt`` with the consumed sample ids, and
``policy-<k>.pt``) and the samples in flight (``DIR/samples/<job>/<k>/shard-<i>.pt``) sit next to it.
A resumed run restarts every job after its last completed iteration: the workers restore the
checkpoint of that iteration and re-run the next rollout (deterministic: the same samples). It runs
the plan in force when the controller died (the last ``plan`` entry) with the refit profiles (the
last ``profile`` entry per job) as the drift detector's expectations, and keeps the replan log.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from weave_rl.core.yamlio import write_text_file
from weave_rl.executor.outputs import json_safe


@dataclass
class JournalState:
    completed: dict[str, int] = field(default_factory=dict)  # job -> last completed iteration
    records: list[dict] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    last_t: float = 0.0
    plan: dict | None = None  # the plan in force (its data), None: the run's own plan
    switches: int = 0
    replans: list[dict] = field(default_factory=list)
    detections: list[dict] = field(default_factory=list)
    profiles: dict[str, dict] = field(default_factory=dict)  # job -> refit spec (jobs-file form)

    def drop_unfinished(self) -> None:
        """Forget the records and metrics of iterations not completed (so far): they are re-run."""
        done = lambda r: int(r["iteration"]) <= self.completed.get(r["job"], -1)  # noqa: E731
        self.records = [r for r in self.records if done(r)]
        self.metrics = [r for r in self.metrics if done(r)]


class Journal:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / "journal.jsonl"
        self._file = None

    def start_fresh(self, inputs: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("samples", "checkpoints"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        self.path.unlink(missing_ok=True)
        write_text_file(self.root / "run.json", json.dumps(inputs, indent=2))  # atomic: never half a file

    def inputs(self) -> dict:
        return json.loads((self.root / "run.json").read_text())

    def read(self) -> JournalState:
        state = JournalState()
        if not self.path.exists():
            return state
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short when the controller died
            kind = entry.get("kind")
            if kind == "record":
                row = entry["row"]
                state.records.append(row)
                state.last_t = max(state.last_t, float(row.get("end_s") or 0.0))
            elif kind == "iteration":
                job, k = entry["job"], int(entry["iteration"])
                state.completed[job] = max(state.completed.get(job, -1), k)
                state.last_t = max(state.last_t, float(entry.get("t") or 0.0))
            elif kind == "metric":
                state.metrics.append(entry["row"])
            elif kind == "event":
                state.events.append(entry)
            elif kind == "plan":
                state.plan = entry["plan"]
                state.switches += 1
            elif kind == "replan":
                state.replans.append(entry["row"])
            elif kind == "detection":
                state.detections.append(entry["row"])
            elif kind == "profile":
                state.profiles[entry["job"]] = entry["spec"]
            elif kind == "resume":
                state.drop_unfinished()
        # Rows of iterations that did not complete are re-run: keep only completed ones.
        state.drop_unfinished()
        return state

    def _write(self, entry: dict) -> None:
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write(json.dumps(json_safe(entry)) + "\n")
        self._file.flush()

    def record(self, row: dict) -> None:
        self._write({"kind": "record", "row": row})

    def iteration(self, job: str, k: int, t: float) -> None:
        self._write({"kind": "iteration", "job": job, "iteration": k, "t": t})

    def metric(self, row: dict) -> None:
        self._write({"kind": "metric", "row": row})

    def event(self, event: dict) -> None:
        self._write({"kind": "event", **event})

    def plan(self, plan: dict, t: float, reason: str) -> None:
        self._write({"kind": "plan", "t": t, "reason": reason, "plan": plan})

    def replan(self, row: dict) -> None:
        self._write({"kind": "replan", "row": row})

    def detection(self, row: dict) -> None:
        self._write({"kind": "detection", "row": row})

    def profile(self, job: str, spec: dict) -> None:
        self._write({"kind": "profile", "job": job, "spec": spec})

    def resumed(self, completed: dict[str, int]) -> None:
        """Mark the start of a resumed controller (see the module doc)."""
        self._write({"kind": "resume", "completed": completed})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

