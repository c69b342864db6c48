"""Rich tables and JSON output for the CLI (the CLI stays thin: parse, call, render)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

# Pipes and CI logs get a wide console so tables are not cut to 80 columns. No emoji codes: a
# ``:1234:`` in an address or a file:line must print as it is.
console = Console(width=None if sys.stdout.isatty() else 160, emoji=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160, emoji=False)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def table(title: str, columns: list[str], rows: list[list[Any]], *, right_from: int = 1) -> Table:
    out = Table(title=title, title_justify="left", show_lines=False)
    for i, name in enumerate(columns):
        out.add_column(name, justify="right" if i >= right_from else "left")
    for row in rows:
        out.add_row(*[fmt(v) for v in row])
    return out


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e9:
            return f"{int(value):,}"
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
