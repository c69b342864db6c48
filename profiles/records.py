"""Measured phase records (DESIGN 3.4): one row per phase run, as CSV or parquet.

The executor writes them, ``weave profile fit`` reads them back to refit the jobs file. Columns:
``RECORD_COLUMNS`` are required (``tokens`` may be empty / NaN, and is for rollout rows); extra
columns are kept as they are. Rows are numbered from 0 in error messages (``row 17.duration_s`` is
the 18th data row, header excluded). Every problem of a file is reported: each missing column, and for
each column and kind of problem its first bad row with the others counted (``row 3.gpus: expected a
number (got 'x'); also rows 7, 9 (3 rows in all)``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from weave_rl.core.errors import InputError, Problem, Problems
from weave_rl.core.yamlio import describe_os_error, max_input_bytes

RowCheck = Callable[[pd.DataFrame], "list[Problem]"]
RECORD_COLUMNS = ["job", "iteration", "phase", "gpus", "gpu_type", "start_s", "duration_s", "switch_s", "tokens"]
STR_COLUMNS = ["job", "phase", "gpu_type"]
INT_COLUMNS = ["iteration", "gpus"]
FLOAT_COLUMNS = ["start_s", "duration_s", "switch_s", "tokens"]
OPTIONAL_COLUMNS = ["tokens"]  # may be absent from a file or a row: filled with NaN
MAX_GPUS = 100_000  # as a jobs file allows
MAX_DURATION_S = 1e8  # as profiles.durations allows
RECORDS_SIZE_FACTOR = 128  # records may be far larger than a YAML input: 128 x its limit (1 GB by default)
_NA = ["", "nan", "NaN", "NA", "N/A", "null", "None"]


def records_frame(rows: Iterable[dict], file: str = "<records>") -> pd.DataFrame:
    """Rows (dicts) -> a checked records frame with the columns' dtypes."""
    frame = pd.DataFrame(list(rows))
    if frame.empty and len(frame.columns) == 0:
        frame = pd.DataFrame(columns=RECORD_COLUMNS)
    return validate_records(frame, file)


def read_records(path: str | Path, check: RowCheck | None = None) -> pd.DataFrame:
    """Read a ``.csv`` or ``.parquet`` records file and check it (``InputError`` on any problem; ``check``
    as in ``validate_records``)."""
    path = Path(path)
    file = str(path)
    kind = _kind(path)
    if not path.exists():
        raise InputError(file, None, "file not found")
    if path.is_dir():
        raise InputError(file, None, "is a directory, expected a records file")
    limit = max_input_bytes() * RECORDS_SIZE_FACTOR
    size = path.stat().st_size
    if size > limit:
        raise InputError(file, None, f"file too large ({size / 1e6:.1f} MB; the limit for records is {limit / 1e6:g} MB, "
                         f"{RECORDS_SIZE_FACTOR} x WEAVE_MAX_INPUT_MB)")
    try:
        if kind == "csv":
            # Job, phase and GPU-type names are read verbatim (a job may be called "NA").
            header = pd.read_csv(path, nrows=0).columns
            na = {c: _NA for c in header if c not in STR_COLUMNS}
            frame = pd.read_csv(
                path, dtype={c: str for c in STR_COLUMNS}, keep_default_na=False, na_values=na
            )
        else:
            frame = pd.read_parquet(path)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise InputError(file, None, f"cannot read {kind} records: {exc}") from None
    return validate_records(frame, file, check)


def write_records(frame: pd.DataFrame, path: str | Path) -> None:
    """Write records as ``.csv`` or ``.parquet`` (by suffix), without the index."""
    path = Path(path)
    kind = _kind(path)
    if path.is_dir():
        raise InputError(str(path), None, "is a directory; give a file name to write")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError(str(path), None, f"cannot write: {describe_os_error(exc)}") from None
    finally:
        if tmp.exists():
            tmp.unlink(missing_ok=True)


def validate_records(frame: pd.DataFrame, file: str = "<records>", check: RowCheck | None = None) -> pd.DataFrame:
    """Check the required columns and values and return a copy with clean dtypes.

    ``check(frame)``, when given, adds the problems of the name columns (job, phase, gpu_type, as
    strings) that only the caller can judge; it runs even when numeric columns are bad, so that
    every problem of the file is reported at once.
    """
    frame = frame.reset_index(drop=True).copy()
    problems = Problems(file)
    found = ", ".join(map(str, frame.columns)) or "none"
    for column in OPTIONAL_COLUMNS:
        if column not in frame.columns:
            frame[column] = np.nan
    for column in RECORD_COLUMNS:
        if column not in frame.columns:
            problems.add(column, f"required column is missing (columns: {found})")
    problems.raise_if_any()
    named = pd.Series(True, index=frame.index)  # rows whose job, phase and GPU type are all given
    for column in STR_COLUMNS:
        values = frame[column]
        bad = values.isna() | (values.astype(str).str.strip() == "")
        _fail(problems, column, bad, values, "missing value")
        named &= ~bad
        frame[column] = values.astype(str)
    numeric_ok: dict[str, pd.Series] = {}
    for column in INT_COLUMNS + FLOAT_COLUMNS:
        raw = frame[column]
        if raw.dtype == bool:  # True is no GPU count
            _fail(problems, column, pd.Series(True, index=raw.index), raw, "expected a number")
            frame[column] = np.nan
            numeric_ok[column] = pd.Series(False, index=raw.index)
            continue
        numbers = pd.to_numeric(raw, errors="coerce").astype(float)
        not_number = raw.notna() & numbers.isna()
        if raw.dtype == object:  # bools among other values
            not_number |= raw.map(lambda v: isinstance(v, (bool, np.bool_)))
            numbers = numbers.mask(not_number)
        _fail(problems, column, not_number, raw, "expected a number")
        missing = numbers.isna() & ~not_number
        if column not in OPTIONAL_COLUMNS:
            _fail(problems, column, missing, raw, "missing value")
        infinite = pd.Series(np.isinf(numbers.to_numpy()), index=numbers.index)
        _fail(problems, column, infinite, raw, "expected a finite number")
        frame[column] = numbers.mask(infinite)
        numeric_ok[column] = numbers.notna() & ~infinite
    for column in INT_COLUMNS:
        numbers = frame[column]
        fractional = numeric_ok[column] & (numbers != np.round(numbers))
        _fail(problems, column, fractional, numbers, "expected an integer")
        numeric_ok[column] &= ~fractional
    checks = [("gpus", lambda x: x <= 0, "expected a GPU count > 0"),
              ("gpus", lambda x: x > MAX_GPUS, f"expected a GPU count <= {MAX_GPUS:,}"),
              ("iteration", lambda x: x < 0, "expected an iteration >= 0"),
              ("duration_s", lambda x: x <= 0, "duration must be > 0"),
              ("duration_s", lambda x: x > MAX_DURATION_S, f"duration must be at most {MAX_DURATION_S:g} s"),
              ("switch_s", lambda x: x < 0, "switch time must be >= 0"),
              ("tokens", lambda x: x < 0, "token count must be >= 0")]
    for column, test, reason in checks:
        _fail(problems, column, numeric_ok[column] & test(frame[column]), frame[column], reason)
    if check is not None:
        problems.extend(check(frame[named]))
    problems.raise_if_any()
    for column in INT_COLUMNS:
        frame[column] = frame[column].astype("int64")
    return frame


SHOWN_ROWS = 10  # row numbers listed per problem; the rest are counted


def _fail(problems: Problems, column: str, bad: pd.Series, values: pd.Series, reason: str) -> None:
    """One problem per column and reason: the first bad row (with its value), the next few and the count."""
    rows = np.flatnonzero(bad.fillna(False).to_numpy(dtype=bool))
    if not len(rows):
        return
    row = int(rows[0])
    value = values.iloc[row]
    value = value.item() if hasattr(value, "item") else value  # numpy scalar -> plain
    shown = "" if _isna(value) else f" (got {value!r})"
    text = reason + shown
    if len(rows) > 1:
        others = ", ".join(str(int(r)) for r in rows[1:SHOWN_ROWS])
        more = ", ..." if len(rows) > SHOWN_ROWS else ""
        text += f"; also row{'s' if len(rows) > 2 else ''} {others}{more} ({len(rows)} rows in all)"
    problems.add(f"row {row}.{column}", text)


def _isna(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise InputError(str(path), None, f"unsupported records format {suffix or '(no suffix)'!r}: use .csv or .parquet")
