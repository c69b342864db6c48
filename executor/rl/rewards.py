"""Rewards of the grpo job: built-in rules, or the user's function named by an import string.

A reward is ``fn(prompt, response, answer) -> float``. ``reward: partial`` (the synthetic tasks'
default) gives credit per right position, ``exact`` 1 for the answer and 0 otherwise (surrounding
whitespace ignored; the datasets' default), ``numeric`` 1 when the last number in the response equals
the answer's last number. ``reward: my_pkg.rewards:score`` imports the user's function in each worker.

A reward that raises, or returns something other than a finite real number, fails the phase with a
:class:`RewardError` naming the reward, the response and the prompt: never a silent zero.
"""

from __future__ import annotations

import importlib
import math
import numbers
import re
from typing import Callable

from weave_rl.executor.rl.tasks import score
from weave_rl.executor.workload import OptionError

RewardFn = Callable[[str, str, str], float]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class RewardError(RuntimeError):
    """The job's reward function failed on a response (the iteration fails with this message)."""


def partial(prompt: str, response: str, answer: str) -> float:
    return score(answer, response)


def exact(prompt: str, response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def numeric(prompt: str, response: str, answer: str) -> float:
    want, got = last_number(answer), last_number(response)
    return 1.0 if want is not None and got is not None and math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-9) else 0.0


BUILTIN = {"partial": partial, "exact": exact, "numeric": numeric}


def load_reward(spec: str) -> RewardFn:
    """The reward for ``spec``: a built-in name or ``package.module:function`` (``OptionError``)."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    if ":" not in spec:
        raise OptionError("reward", f"unknown reward {spec!r} (built-in: {', '.join(BUILTIN)}; or an import "
                                    "string package.module:function)")
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise OptionError("reward", f"cannot import {module_name!r} (ModuleNotFoundError: {exc}); is its folder "
                                    "on PYTHONPATH, or its package installed?") from None
    except Exception as exc:  # noqa: BLE001  the user's module failed at import time
        raise OptionError("reward", f"importing {module_name!r} failed ({type(exc).__name__}: {exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise OptionError("reward", f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise OptionError("reward", f"{spec} is not callable (it is a {type(obj).__name__})")
    return obj


def call_reward(fn: RewardFn, name: str, prompt: str, response: str, answer: str, where: str) -> float:
    """``fn(prompt, response, answer)`` as a float, or a ``RewardError`` saying what went wrong."""
    try:
        value = fn(prompt, response, answer)
    except Exception as exc:  # noqa: BLE001  the user's code: report it with the response it failed on
        raise RewardError(f"reward {name} raised {type(exc).__name__}: {exc} on {where} "
                          f"(prompt {prompt[:80]!r}, response {response[:80]!r})") from exc
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):  # bool counts as 0 / 1
        raise RewardError(f"reward {name} returned {value!r} ({type(value).__name__}), not a finite number, on "
                          f"{where} (prompt {prompt[:80]!r}, response {response[:80]!r})")
    return float(value)
