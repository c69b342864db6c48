"""One error type for every user mistake: it names the file, the key path and the reason.

An ``InputError`` holds one or more ``Problem`` s (file, key path, reason each). The CLI prints
``str(error)`` and exits with code 2; no traceback reaches the user. One problem prints on one line,
``file: key: reason``; several print one per line under a first line naming the file and the count::

    jobs.yaml: 3 problems
      jobs[0].rollout.gpus: Input should be greater than 0 (got 0)
      jobs[1].name: required key is missing
      jobs[2].train.duration_s: duration must be a finite number > 0

Loaders gather every problem of a file they can find (``Problems``) and raise them together.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

MAX_SHOWN = 500  # problems printed in full (one line each); past that, counted


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: the file, the key path in it (may be empty) and why."""

    file: str
    key: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.key}" if self.key else self.file
        return f"{where}: {self.reason}"


class InputError(Exception):
    """Bad user input: ``InputError(file, key, reason)`` for one problem, ``InputError(problems=[...])``
    (or ``InputError.many``) for several. ``file``, ``key`` and ``reason`` are the first problem's."""

    exit_code = 2

    def __init__(self, file: str | None = None, key: str | None = None, reason: str = "invalid input", *,
                 problems: Iterable[Problem | tuple] | None = None):
        items = [_problem(p) for p in problems] if problems is not None else []
        if not items:
            items = [Problem(file or "<input>", key or "", reason)]
        self.problems: list[Problem] = _unique(items)
        first = self.problems[0]
        self.file, self.key, self.reason = first.file, first.key, first.reason
        super().__init__(str(self))

    @classmethod
    def many(cls, problems: Iterable[Problem | tuple]) -> "InputError":
        return cls(problems=list(problems))

    def __reduce__(self):  # pickled whole (worker processes, Ray), not rebuilt from its message
        return (_rebuild, (type(self), self.problems, self.__dict__))

    def __str__(self) -> str:
        problems = self.problems
        if len(problems) == 1:
            return str(problems[0])
        files = list(dict.fromkeys(p.file for p in problems))
        one_file = len(files) == 1
        head = f"{files[0]}: {len(problems)} problems" if one_file else \
            f"{len(problems)} problems in {', '.join(files)}"
        lines = [head]
        for p in problems[:MAX_SHOWN]:
            text = (f"{p.key}: {p.reason}" if p.key else p.reason) if one_file else str(p)
            lines.append("  " + text)
        if len(problems) > MAX_SHOWN:
            lines.append(f"  ... and {len(problems) - MAX_SHOWN} more problems not shown")
        return "\n".join(lines)


def _rebuild(cls: type, problems: list[Problem], state: dict) -> InputError:
    error = cls.__new__(cls)
    InputError.__init__(error, problems=problems)
    error.__dict__.update(state)
    return error


def _problem(p: Problem | tuple) -> Problem:
    if isinstance(p, Problem):
        return p
    file, key, reason = p
    return Problem(file or "<input>", key or "", reason)


def _unique(items: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(items))


class Problems:
    """Gather the problems of one input, then raise them all at once::

        problems = Problems(file)
        problems.add("jobs[2].name", "duplicate job name 'A'")
        with problems.collect():  # an InputError raised inside is kept, not propagated
            check_something()
        problems.raise_if_any()
    """

    def __init__(self, file: str | None):
        self.file = file or "<input>"
        self.items: list[Problem] = []

    def add(self, key: str | None, reason: str, file: str | None = None) -> None:
        self.items.append(Problem(file or self.file, key or "", reason))

    def extend(self, error: "InputError | Iterable[Problem]") -> None:
        self.items.extend(error.problems if isinstance(error, InputError) else error)

    @contextmanager
    def collect(self) -> Iterator[None]:
        try:
            yield
        except InputError as exc:
            self.extend(exc)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def error(self) -> InputError:
        return InputError.many(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise InputError.many(self.items)


def key_path(parts: Iterable[Any]) -> str:
    """``("jobs", 2, "rollout", "gpus")`` -> ``jobs[2].rollout.gpus``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


# pydantic names the branches of a union in the location (``quantile.float``); they are no YAML keys.
_BRANCH_TAGS = {"float", "int", "str", "bool", "none", "dict", "list", "tuple", "literal", "is-instance"}


def _is_branch(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part.startswith("function") or part in _BRANCH_TAGS)


def validation_problems(file: str | None, error: Any, prefix: Iterable[Any] = ()) -> list[Problem]:
    """Every problem of a pydantic ``ValidationError``, each with its key path under ``prefix``.

    The branches of a union that all failed on one key become one problem (their reasons joined by
    "or").
    """
    prefix = list(prefix)
    merged: dict[str, tuple[list[str], str]] = {}
    for problem in error.errors():
        loc = [p for p in problem.get("loc", ()) if not _is_branch(p)]
        key = key_path([*prefix, *loc])
        reasons, got = merged.setdefault(key, ([], _got(problem)))
        reason = _message(problem)
        if reason not in reasons:
            reasons.append(reason)
    return [Problem(file or "<input>", key, " or ".join(reasons) + got) for key, (reasons, got) in merged.items()]


def from_validation_error(file: str | None, error: Any, prefix: Iterable[Any] = ()) -> InputError:
    """Turn a pydantic ``ValidationError`` into an ``InputError`` listing every one of its problems."""
    return InputError.many(validation_problems(file, error, prefix))


def _reason(problem: dict) -> str:
    return _message(problem) + _got(problem)


def _message(problem: dict) -> str:
    kind = problem.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if isinstance(problem.get("input"), bool) and kind in _NUMBER_TYPES:
        return f"expected {_NUMBER_TYPES[kind]}, not true/false"
    msg = problem.get("msg", "invalid value")
    msg = re.sub(r" or instance of \w+", "", msg)  # "a valid dictionary or instance of PhaseSpec"
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


_NUMBER_TYPES = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
                 "float_type": "a number", "float_parsing": "a number"}


def _got(problem: dict) -> str:
    """`` (got 'x')`` for a short scalar input, else ``""``."""
    if problem.get("type", "") in ("missing", "extra_forbidden"):
        return ""
    value = problem.get("input")
    if value is None:
        return " (got null: the key has no value)"
    if isinstance(value, (int, float, str, bool)) and len(str(value)) < 60 and "(got " not in problem.get("msg", ""):
        return f" (got {value!r})"
    return ""
