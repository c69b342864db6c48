"""Measured phase records (DESIGN 3.4): one row per phase run, as CSV or parquet.

The executor writes them, ``weave profile fit`` reads them back to refit the jobs file. Columns:
``RECORD_COLUMNS`` are required (``tokens`` may be empty / NaN, and is for rollout rows); extra
columns are kept as they are. Rows are numbered from 0 in error messages (``row 17.duration_s`` is
the 18th data row, header excluded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from weave_rl.core.errors import InputError

RECORD_COLUMNS = ["job", "iteration", "phase", "gpus", "gpu_type", "start_s", "duration_s", "switch_s", "tokens"]
STR_COLUMNS = ["job", "phase", "gpu_type"]
INT_COLUMNS = ["iteration", "gpus"]
FLOAT_COLUMNS = ["start_s", "duration_s", "switch_s", "tokens"]
OPTIONAL_COLUMNS = ["tokens"]  # may be absent from a file or a row: filled with NaN
_NA = ["", "nan", "NaN", "NA", "N/A", "null", "None"]


def records_frame(rows: Iterable[dict], file: str = "<records>") -> pd.DataFrame:
    """Rows (dicts) -> a checked records frame with the columns' dtypes."""
    frame = pd.DataFrame(list(rows))
    if frame.empty and len(frame.columns) == 0:
        frame = pd.DataFrame(columns=RECORD_COLUMNS)
    return validate_records(frame, file)


def read_records(path: str | Path) -> pd.DataFrame:
    """Read a ``.csv`` or ``.parquet`` records file and check it (``InputError`` on any problem)."""
    path = Path(path)
    file = str(path)
    kind = _kind(path)
    if not path.exists():
        raise InputError(file, None, "file not found")
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
    return validate_records(frame, file)


def write_records(frame: pd.DataFrame, path: str | Path) -> None:
    """Write records as ``.csv`` or ``.parquet`` (by suffix), without the index."""
    path = Path(path)
    kind = _kind(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)


def validate_records(frame: pd.DataFrame, file: str = "<records>") -> pd.DataFrame:
    """Check the required columns and values and return a copy with clean dtypes."""
    frame = frame.reset_index(drop=True).copy()
    for column in OPTIONAL_COLUMNS:
        if column not in frame.columns:
            frame[column] = np.nan
    for column in RECORD_COLUMNS:
        if column not in frame.columns:
            raise InputError(file, column, "required column is missing")
    for column in STR_COLUMNS:
        values = frame[column]
        bad = values.isna() | (values.astype(str).str.strip() == "")
        _fail_first(file, column, bad, values, "missing value")
        frame[column] = values.astype(str)
    for column in INT_COLUMNS + FLOAT_COLUMNS:
        raw = frame[column]
        numbers = pd.to_numeric(raw, errors="coerce").astype(float)
        _fail_first(file, column, raw.notna() & numbers.isna(), raw, "expected a number")
        if column not in OPTIONAL_COLUMNS:
            _fail_first(file, column, numbers.isna(), raw, "missing value")
        _fail_first(file, column, np.isinf(numbers), raw, "expected a finite number")
        frame[column] = numbers
    for column in INT_COLUMNS:
        numbers = frame[column]
        _fail_first(file, column, numbers != np.round(numbers), numbers, "expected an integer")
        frame[column] = numbers.astype("int64")
    _fail_first(file, "gpus", frame["gpus"] <= 0, frame["gpus"], "expected a GPU count > 0")
    _fail_first(file, "iteration", frame["iteration"] < 0, frame["iteration"], "expected an iteration >= 0")
    _fail_first(file, "duration_s", frame["duration_s"] <= 0, frame["duration_s"], "duration must be > 0")
    _fail_first(file, "switch_s", frame["switch_s"] < 0, frame["switch_s"], "switch time must be >= 0")
    _fail_first(file, "tokens", frame["tokens"] < 0, frame["tokens"], "token count must be >= 0")
    return frame


def _fail_first(file: str, column: str, bad: pd.Series, values: pd.Series, reason: str) -> None:
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        value = values.iloc[row]
        value = value.item() if hasattr(value, "item") else value  # numpy scalar -> plain
        shown = "" if pd.isna(value) else f" (got {value!r})"
        raise InputError(file, f"row {row}.{column}", reason + shown)


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise InputError(str(path), None, f"unsupported records format {suffix or '(no suffix)'!r}: use .csv or .parquet")
