"""One error type for every user mistake: it names the file, the key path and the reason.

The CLI prints ``str(error)`` on one line and exits with code 2; no traceback reaches the user.
"""

from __future__ import annotations

from typing import Any, Iterable


class InputError(Exception):
    """Bad user input: a file, a key path inside it (``jobs[2].rollout.gpus``) and the reason."""

    exit_code = 2

    def __init__(self, file: str | None, key: str | None, reason: str):
        self.file = file or "<input>"
        self.key = key or ""
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.file}: {self.key}" if self.key else self.file
        return f"{where}: {self.reason}"


def key_path(parts: Iterable[Any]) -> str:
    """``("jobs", 2, "rollout", "gpus")`` -> ``jobs[2].rollout.gpus``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation_error(file: str | None, error: Any, prefix: Iterable[Any] = ()) -> InputError:
    """Turn a pydantic ``ValidationError`` into an ``InputError`` for its first problem."""
    problems = error.errors()
    first = problems[0]
    # Drop pydantic's union/tagged branch names (e.g. "function-after[...]") from the path.
    loc = [p for p in first.get("loc", ()) if not (isinstance(p, str) and ("[" in p or p.startswith("function")))]
    reason = _reason(first)
    if len(problems) > 1:
        reason += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
    return InputError(file, key_path([*prefix, *loc]), reason)


def _reason(problem: dict) -> str:
    kind = problem.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = problem.get("msg", "invalid value")
    msg = msg.removeprefix("Value error, ")
    value = problem.get("input")
    if kind not in ("missing",) and isinstance(value, (int, float, str, bool)) and len(str(value)) < 60:
        return f"{msg} (got {value!r})"
    return msg
