"""Verifiable synthetic tasks with rule-based rewards.

Each problem is a prompt string and its one right answer. The score gives partial credit per
correct position and divides by the longer of answer and response, so a random model already
earns a little (right digit in the right place) and the reward keeps rising with every digit
and with stopping at the right length: a dense signal a tiny model can climb in a few dozen steps.
Prompts are fixed width (zero-padded) so every prompt of a task has the same token count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

TASKS = ("addition", "sort", "copy")


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


def score(answer: str, response: str) -> float:
    """Fraction of answer positions the response gets right, over max(len(answer), len(response))."""
    if not answer and not response:
        return 1.0
    right = sum(a == r for a, r in zip(answer, response))
    return right / max(len(answer), len(response))


def _addition(rng: random.Random, digits: int) -> Problem:
    a, b = rng.randrange(10**digits), rng.randrange(10**digits)
    return Problem(f"{a:0{digits}d}+{b:0{digits}d}=", f"{a + b:0{digits + 1}d}")


def _sort(rng: random.Random, digits: int) -> Problem:
    s = "".join(rng.choice("0123456789") for _ in range(digits))
    return Problem(f"{s}>", "".join(sorted(s)))


def _copy(rng: random.Random, digits: int) -> Problem:
    s = "".join(rng.choice("0123456789") for _ in range(digits))
    return Problem(f"{s}:", s)


_MAKERS: dict[str, Callable[[random.Random, int], Problem]] = {"addition": _addition, "sort": _sort, "copy": _copy}


@dataclass(frozen=True)
class Task:
    name: str
    digits: int

    def __post_init__(self) -> None:
        if self.name not in _MAKERS:
            raise ValueError(f"unknown task {self.name!r} (known: {', '.join(TASKS)})")
        if self.digits < 1:
            raise ValueError(f"task digits must be >= 1, got {self.digits}")

    def problem(self, seed: int) -> Problem:
        """The problem drawn from a 64-bit seed (Python's Random: same in every process)."""
        return _MAKERS[self.name](random.Random(seed), self.digits)

    @property
    def answer_len(self) -> int:
        return self.digits + 1 if self.name == "addition" else self.digits
