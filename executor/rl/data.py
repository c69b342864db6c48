"""Prompt datasets of the grpo job: a JSONL or parquet file of prompts with reference answers.

Rows become :class:`~weave_rl.executor.rl.tasks.Problem` (prompt text, answer text); the field
names are options (``prompt_field``, ``answer_field``). An iteration takes ``prompts_per_iteration``
consecutive positions of a stream of epochs, each epoch a permutation of the rows seeded by
``(seed, epoch)`` (or the file's order with ``shuffle: false``): prompt ``p`` of iteration ``k`` depends
only on ``(seed, k, p)``, in every process and on every re-run, and each row comes once per epoch.
"""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path
from typing import Any, Sequence

from weave_rl.executor.prompt_groups import mix_seed
from weave_rl.executor.rl.tasks import Problem
from weave_rl.executor.workload import OptionError

SUFFIXES = (".jsonl", ".parquet")
STREAM_EPOCH = 2


def _text(value: Any, what: str, where: str, key: str, field: str) -> str:
    if isinstance(value, str):
        return value
    if what == "answer" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)  # numeric answers (JSON numbers, parquet int columns) compare as text
    raise OptionError(key, f"{where}: field {field!r} must be a string, got {value!r}")


def _rows_jsonl(path: Path) -> list[tuple[str, dict]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise OptionError("dataset", f"{path} line {n}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise OptionError("dataset", f"{path} line {n}: not a JSON object")
            rows.append((f"{path} line {n}", row))
    return rows


def _rows_parquet(path: Path, fields: Sequence[str]) -> list[tuple[str, dict]]:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001  not a parquet file, truncated, ...
        raise OptionError("dataset", f"{path}: cannot read as parquet ({type(exc).__name__}: {exc})") from None
    for key, name in zip(("prompt_field", "answer_field"), fields):
        if name not in schema.names:
            raise OptionError(key, f"no column {name!r} in {path} (its columns: {', '.join(schema.names)})")
    table = pq.read_table(path, columns=list(fields))
    cols = [table.column(name).to_pylist() for name in fields]
    return [(f"{path} row {i}", dict(zip(fields, values))) for i, values in enumerate(zip(*cols))]


@functools.lru_cache(maxsize=4)
def load_problems(path: str, prompt_field: str, answer_field: str) -> tuple[Problem, ...]:
    """The dataset's problems in file order (``OptionError`` naming the option at fault)."""
    p = Path(path)
    if p.suffix not in SUFFIXES:
        raise OptionError("dataset", f"{path}: unknown format {p.suffix or '(no suffix)'!r} "
                                     f"(a {' or '.join(SUFFIXES)} file)")
    if not p.is_file():
        raise OptionError("dataset", f"{path}: file not found")
    fields = (prompt_field, answer_field)
    rows = _rows_jsonl(p) if p.suffix == ".jsonl" else _rows_parquet(p, fields)
    if not rows:
        raise OptionError("dataset", f"{path}: no rows")
    problems = []
    for where, row in rows:
        for key, name in zip(("prompt_field", "answer_field"), fields):
            if name not in row:
                raise OptionError(key, f"{where} has no field {name!r} (its fields: {', '.join(map(str, row))})")
        prompt = _text(row[prompt_field], "prompt", where, "prompt_field", prompt_field)
        answer = _text(row[answer_field], "answer", where, "answer_field", answer_field)
        if not prompt:
            raise OptionError("prompt_field", f"{where}: empty prompt")
        problems.append(Problem(prompt, answer))
    return tuple(problems)


class PromptStream:
    """Prompt ``p`` of iteration ``k`` over a dataset: epochs of seeded permutations."""

    def __init__(self, problems: Sequence[Problem], per_iteration: int, seed: int, shuffle: bool = True) -> None:
        if not problems:
            raise ValueError("PromptStream needs at least one problem")
        self.problems = tuple(problems)
        self.per_iteration = per_iteration
        self.seed = seed
        self.shuffle = shuffle
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        """Row indices of an epoch (a permutation seeded by (seed, epoch), or file order)."""
        if epoch not in self._orders:
            rows = list(range(len(self.problems)))
            if self.shuffle:
                random.Random(mix_seed(self.seed, epoch, STREAM_EPOCH)).shuffle(rows)
            if len(self._orders) > 8:
                self._orders.clear()
            self._orders[epoch] = rows
        return self._orders[epoch]

    def row(self, iteration: int, prompt: int) -> int:
        epoch, pos = divmod(iteration * self.per_iteration + prompt, len(self.problems))
        return self.order(epoch)[pos]

    def problem(self, iteration: int, prompt: int) -> Problem:
        return self.problems[self.row(iteration, prompt)]
