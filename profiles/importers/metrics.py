"""Reading per-step metric dicts out of a training log: console lines, JSON lines or a CSV export.

Each framework importer hands in a *line parser* for its console format; JSON lines and CSV
tracking exports are shared. Every line that is not blank and yields no step is remembered with
its line number and the reason, so the importer can warn with a count ("3 lines skipped: 7, 12,
40 (not a metrics line)") instead of dropping it silently.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from weave_rl.core.errors import InputError

# A console parser returns (step, metrics) for a metrics line, None for any other line, and raises
# ValueError (with a short reason) for a line that looks like metrics but cannot be read.
LineParser = Callable[[str], "tuple[int, dict[str, float]] | None"]

STEP_KEYS = ("step", "_step", "Step", "global_step", "train/global_step", "trainer/global_step")
_NUMPY_WRAPPER = re.compile(r"^(?:np|numpy)\.(?:float|int|uint)\d*\((.*)\)$")  # pprint of numpy scalars


@dataclass(frozen=True)
class StepMetrics:
    line: int  # 1-based line of the file the step came from
    step: int
    metrics: dict[str, float]


@dataclass
class Skipped:
    """Lines (1-based) left out, grouped by reason, in file order."""

    by_reason: dict[str, list[int]] = field(default_factory=dict)

    def add(self, line: int, reason: str) -> None:
        self.by_reason.setdefault(reason, []).append(line)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.by_reason.values())

    def warnings(self, shown: int = 10) -> list[str]:
        out = []
        for reason, lines in self.by_reason.items():
            listed = ", ".join(str(n) for n in lines[:shown]) + (", ..." if len(lines) > shown else "")
            out.append(f"{len(lines)} line{'s' if len(lines) != 1 else ''} skipped: {listed} ({reason})")
        return out


def number(text: Any) -> float:
    """A metric value as float: plain numbers, numeric strings, ``np.float64(1.5)``; ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"not a number: {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = str(text).strip()
        wrapped = _NUMPY_WRAPPER.match(raw)
        value = float(wrapped.group(1) if wrapped else raw)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r}")
    return value


def python_literal(text: str) -> Any:
    """A Python literal as ``print``/``pprint`` write dicts (configs, status dicts), never evaluated:
    a call with one number (``np.float64(1.5)``, ``tensor(0.5)``) reads as that number, any other
    call or name (``DictConfig(...)``, ``inf``) as None; None when the text is not an expression."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values) if k is not None}
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = value(node.operand)
            if isinstance(inner, (int, float)) and not isinstance(inner, bool):
                return -inner if isinstance(node.op, ast.USub) else inner
            return None
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
            inner = value(node.args[0])
            return inner if isinstance(inner, (int, float)) and not isinstance(inner, bool) else None
        return None

    try:
        return value(tree)
    except (TypeError, RecursionError):  # an unhashable key, a literal nested too deep
        return None


def step_number(value: Any) -> int:
    step = number(value)
    if step != int(step) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {value!r}")
    return int(step)


def flat_metrics(data: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """``{"step": N, "data"|"metrics": {...}}`` or a flat ``{"step": N, key: value}`` -> (step, numeric metrics).

    Non-numeric values (strings, lists) are dropped: trackers log text next to timings.
    """
    nested = next((data[k] for k in ("data", "metrics") if isinstance(data.get(k), Mapping)), None)
    metrics_in = dict(nested) if nested is not None else dict(data)
    step_raw = next((data[k] for k in STEP_KEYS if k in data), None)
    if step_raw is None:
        step_raw = next((metrics_in[k] for k in STEP_KEYS if k in metrics_in), None)
    if step_raw is None:
        raise ValueError("no step key (" + ", ".join(STEP_KEYS[:4]) + ")")
    step = step_number(step_raw)
    metrics = {}
    for key, value in metrics_in.items():
        if key in STEP_KEYS or value is None or value == "":
            continue
        try:
            metrics[str(key)] = number(value)
        except (TypeError, ValueError):
            continue
    return step, metrics


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")  # colour codes (Ray's worker prefixes) and titles

# An importer may regroup the physical lines before they are parsed: (line number, text) pairs in,
# (line number of the first line, joined text) out; lines it folds into another disappear (they are
# part of that step, not skipped).
LineJoiner = Callable[["list[tuple[int, str]]"], "list[tuple[int, str]]"]


def physical_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, text) per line as ``grep -n`` counts them: only ``\\n`` ends a line; a
    ``\\r\\n`` ending is dropped, ANSI colour codes are removed, a tqdm ``\\r`` inside a line is kept
    (see ``segments``)."""
    out = []
    for number_, line in enumerate(text.split("\n"), start=1):
        out.append((number_, ANSI.sub("", line.removesuffix("\r"))))
    if out and not out[-1][1]:
        out.pop()  # the newline that ends the file
    return out


def segments(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """A tqdm bar redraws itself with ``\\r``: each redraw, and the text after the last one, is a
    segment of the same physical line (numbered as that line)."""
    out = []
    for number_, line in lines:
        parts = [p for p in line.split("\r") if p.strip()] if "\r" in line else [line]
        out.extend((number_, p) for p in parts)
    return out


def read_steps(path: Path, console: LineParser, console_name: str,
               join: LineJoiner | None = None) -> tuple[list[StepMetrics], Skipped, str]:
    """All steps of a log file, the skipped lines and the format read (``csv``, ``jsonl``, ``console``).

    ``.csv``/``.tsv`` files are tracking exports (one row per step, a step column); any other file
    is read line by line (``physical_lines``, ``segments``): a segment starting with ``{`` is JSON,
    anything else goes to ``console``. Line numbers are physical lines (what ``grep -n`` and editors
    show); a line is skipped (once) when none of its segments yields a step.
    """
    text = read_log_text(path)
    if path.suffix.lower() in (".csv", ".tsv"):
        steps, skipped = _read_csv(text, "\t" if path.suffix.lower() == ".tsv" else ",", str(path))
        return steps, skipped, "csv"
    steps: list[StepMetrics] = []
    skipped = Skipped()
    kinds = set()
    parts = segments(physical_lines(text))
    if join is not None:
        parts = join(parts)
    article = "an" if console_name[:1].lower() in "aeiou" else "a"
    outcome: dict[int, str | None] = {}  # line -> None once it gave a step, else its first reason
    for number_, line in parts:
        stripped = line.strip()
        if not stripped:
            continue
        try:
            if stripped.startswith("{"):
                try:
                    data = json.loads(stripped)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"malformed JSON: {exc.msg}") from None
                except RecursionError:
                    raise ValueError("JSON nested too deeply") from None
                if not isinstance(data, dict):
                    raise ValueError("JSON line is not an object")
                step, metrics = flat_metrics(data)
                kind = "jsonl"
            else:
                parsed = console(line)
                if parsed is None:
                    outcome.setdefault(number_, f"not {article} {console_name} metrics line")
                    continue
                step, metrics = parsed
                kind = "console"
        except RecursionError:  # metrics nested past Python's stack (flattening them)
            outcome[number_] = "metrics nested too deeply"
            continue
        except ValueError as exc:
            before = outcome.get(number_, "not ")
            if before is not None and before.startswith("not "):
                outcome[number_] = str(exc)  # a line that looked like metrics: its reason beats "not a metrics line"
            continue
        kinds.add(kind)
        outcome[number_] = None
        steps.append(StepMetrics(number_, step, metrics))
    for number_, reason in sorted(outcome.items()):
        if reason is not None:
            skipped.add(number_, reason)
    return steps, skipped, "+".join(sorted(kinds)) or "console"


def read_log_text(path: Path) -> str:
    file = str(path)
    if not path.exists():
        raise InputError(file, None, "file not found")
    if path.is_dir():
        raise InputError(file, None, "is a directory, expected a log file")
    try:  # bytes, not read_text: universal newlines would turn every tqdm "\r" into a line break
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise InputError(file, None, f"cannot read: {exc.strerror}") from None


def _read_csv(text: str, delimiter: str, file: str) -> tuple[list[StepMetrics], Skipped]:
    lines = text.splitlines()
    reader = csv.reader(lines, delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise InputError(file, None, "empty CSV file (expected a header with a step column)") from None
    header = [h.strip() for h in header]
    step_col = next((h for h in STEP_KEYS if h in header), None)
    if step_col is None:
        raise InputError(file, "header", f"no step column (expected one of {', '.join(STEP_KEYS)})")
    steps: list[StepMetrics] = []
    skipped = Skipped()
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            skipped.add(line, f"{len(row)} cells, the header has {len(header)}")
            continue
        try:
            step, metrics = flat_metrics(dict(zip(header, row)))
        except ValueError as exc:
            skipped.add(line, str(exc))
            continue
        steps.append(StepMetrics(line, step, metrics))
    return steps, skipped
