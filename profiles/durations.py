"""Phase-duration models: the four forms ``duration_s`` may take in a jobs file.

Profiles are noisy (rollout length depends on how long the sampled responses get), so a phase
duration is a distribution. The planner reads one quantile of it (``--quantile 0.95``, or ``max``
for Weave's worst-case planning); the simulator draws samples from it.

==========================  =================================================================
YAML form                   model
==========================  =================================================================
``120``                     constant: every quantile, the mean and every sample are 120.
``{samples: [..]}``         empirical: ``quantile(q)`` is numpy's linear-interpolation quantile
                            of the samples, ``max`` the largest sample, ``sample`` draws one of
                            the samples uniformly.
``{mean: m, std: s}``       normal N(m, s) truncated at a small positive floor
                            (``1e-3 * m``): ``quantile(q)`` is the normal inverse CDF
                            (``statistics.NormalDist``) raised to the floor; ``max`` is the
                            0.9999 quantile; ``sample`` is a normal draw clipped to
                            ``[floor, max]``. ``mean()`` is m (the truncation is ignored).
``{p50: a, p95: b, max: c}``  lognormal through the two anchors: ``mu = ln a``,
                            ``sigma = (ln b - ln a) / z95`` with ``z95 = 1.6448536...`` (the
                            standard normal 0.95 quantile), capped at c: ``quantile(q) =
                            min(lognormal_q, c)``; ``max`` is c if given, else the 0.9999
                            quantile. ``sample`` goes through the inverse CDF and the cap, so it
                            never exceeds ``max``. ``mean()`` is the mean of the capped law.
==========================  =================================================================

Quantiles are taken for ``q`` in (0, 1] or the string ``"max"``; ``quantile(1.0)`` is
``quantile("max")``. A duration is always > 0: zero or negative values are rejected.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Z95 = NormalDist().inv_cdf(0.95)  # 1.6448536...
MAX_QUANTILE = 0.9999  # what "max" means for the unbounded normal / lognormal forms
NORMAL_FLOOR = 1e-3  # the normal form is truncated at this fraction of its mean

MAX_DURATION_S = 1e8  # about three years: past any phase, far from overflowing products of durations
PositiveFloat = Annotated[float, Field(gt=0, le=MAX_DURATION_S, strict=True)]
_FORMS = "a number > 0, {samples: [...]}, {mean: m, std: s} or {p50: a, p95: b, max: c}"


def parse_quantile(q: float | str) -> float | str:
    """Check a quantile: a number in (0, 1] or ``"max"``; numeric strings (CLI input) are accepted."""
    if isinstance(q, str):
        text = q.strip().lower()
        if text == "max":
            return "max"
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"quantile must be a number in (0, 1] or 'max', got {q!r}") from None
    elif isinstance(q, bool) or not isinstance(q, (int, float, np.integer, np.floating)):
        raise ValueError(f"quantile must be a number in (0, 1] or 'max', got {q!r}")
    else:
        value = float(q)
    if not (0.0 < value <= 1.0):  # also rejects NaN
        raise ValueError(f"quantile must be a number in (0, 1] or 'max', got {q!r}")
    return value


class Duration(BaseModel):
    """A phase duration in seconds, in one of the four forms of the module docstring.

    Build it with ``Duration.parse(raw)`` from the YAML value (or use it as a pydantic field type:
    the raw YAML value is accepted directly). Exactly one group of fields is set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    value: PositiveFloat | None = None
    samples: Annotated[tuple[PositiveFloat, ...], Field(min_length=1)] | None = None
    mu: PositiveFloat | None = Field(None, alias="mean")
    sigma: Annotated[float, Field(ge=0, le=MAX_DURATION_S, strict=True)] | None = Field(None, alias="std")
    p50: PositiveFloat | None = None
    p95: PositiveFloat | None = None
    cap: PositiveFloat | None = Field(None, alias="max")

    @model_validator(mode="before")
    @classmethod
    def _from_raw(cls, raw: Any) -> Any:
        if isinstance(raw, Duration):
            return raw
        if isinstance(raw, bool):
            raise ValueError(f"expected {_FORMS}")
        if isinstance(raw, (int, float, np.integer, np.floating)):
            if not math.isfinite(raw) or raw <= 0:
                raise ValueError("duration must be a finite number > 0")
            if raw > MAX_DURATION_S:
                raise ValueError(f"duration must be at most {MAX_DURATION_S:g} s")
            return {"value": float(raw)}
        if isinstance(raw, dict):
            if "value" in raw:
                raise ValueError(f"unknown key 'value': expected {_FORMS}")
            return raw
        raise ValueError(f"expected {_FORMS}")

    @model_validator(mode="after")
    def _one_form(self) -> Duration:
        keys = {"samples": "samples", "mu": "mean", "sigma": "std", "p50": "p50", "p95": "p95", "cap": "max"}
        given = [yaml_key for field, yaml_key in keys.items() if getattr(self, field) is not None]
        if self.value is not None:
            return self
        forms = [("samples",), ("mean", "std"), ("p50", "p95", "max")]
        matching = [form for form in forms if set(given) <= set(form)]
        if not given or not matching:
            raise ValueError(f"keys {', '.join(given) or '(none)'} do not make one form; expected {_FORMS}")
        needed = [k for k in matching[0] if k != "max" and k not in given]
        if needed:
            raise ValueError(f"{', '.join(given)} also needs {', '.join(needed)}")
        if self.p50 is not None:
            if self.p95 < self.p50:
                raise ValueError(f"need p50 <= p95 (got p50={self.p50}, p95={self.p95})")
            if self.cap is not None and self.cap < self.p95:
                raise ValueError(f"need p95 <= max (got p95={self.p95}, max={self.cap})")
        return self

    def __repr_args__(self):
        return [(k, v) for k, v in super().__repr_args__() if v is not None]

    @classmethod
    def parse(cls, raw: Any) -> Duration:
        """The YAML value -> Duration; raises pydantic's ``ValidationError`` (a ``ValueError``)."""
        return cls.model_validate(raw)

    # --- what the form is --------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """``constant``, ``samples``, ``normal`` or ``lognormal``."""
        if self.value is not None:
            return "constant"
        if self.samples is not None:
            return "samples"
        if self.mu is not None:
            return "normal"
        return "lognormal"

    def to_raw(self) -> Any:
        """The YAML form back (``Duration.parse(d.to_raw()) == d``)."""
        kind = self.kind
        if kind == "constant":
            return _num(self.value)
        if kind == "samples":
            return {"samples": [_num(s) for s in self.samples]}
        if kind == "normal":
            return {"mean": _num(self.mu), "std": _num(self.sigma)}
        raw = {"p50": _num(self.p50), "p95": _num(self.p95)}
        if self.cap is not None:
            raw["max"] = _num(self.cap)
        return raw

    # --- the distribution --------------------------------------------------------------------
    def quantile(self, q: float | str) -> float:
        """The duration at quantile ``q`` in (0, 1], or at ``"max"`` (same as ``q = 1``)."""
        q = parse_quantile(q)
        if q == "max" or q == 1.0:
            return self._max()
        kind = self.kind
        if kind == "constant":
            return self.value
        if kind == "samples":
            return float(np.quantile(np.asarray(self.samples), q))
        if kind == "normal":
            if self.sigma == 0:
                return self.mu
            return max(self._floor(), NormalDist(self.mu, self.sigma).inv_cdf(q))
        # lognormal: the two anchors come back exactly, not through exp(log(x)).
        if q == 0.5:
            value = self.p50
        elif q == 0.95:
            value = self.p95
        else:
            value = self._lognormal(NormalDist().inv_cdf(q))
        return min(value, self._max())

    def sample(self, rng: np.random.Generator) -> float:
        """One random duration, always in ``(0, quantile("max")]``."""
        kind = self.kind
        if kind == "constant":
            return self.value
        if kind == "samples":
            return float(self.samples[rng.integers(len(self.samples))])
        if kind == "normal":
            return float(min(max(rng.normal(self.mu, self.sigma), self._floor()), self._max()))
        u = rng.random()
        while u == 0.0:  # inv_cdf needs u in (0, 1); rng.random() is in [0, 1)
            u = rng.random()
        return min(self._lognormal(NormalDist().inv_cdf(u)), self._max())

    def mean(self) -> float:
        """Expected duration (for the normal form: m, ignoring the tiny truncation)."""
        kind = self.kind
        if kind == "constant":
            return self.value
        if kind == "samples":
            return float(np.mean(self.samples))
        if kind == "normal":
            return self.mu
        mu, sigma, cap = math.log(self.p50), self._sigma(), self._max()
        if sigma == 0:
            return min(self.p50, cap)
        # E[min(X, c)] for X ~ LogNormal(mu, sigma).
        z = (math.log(cap) - mu) / sigma
        phi = NormalDist().cdf
        return math.exp(mu + sigma**2 / 2) * phi(z - sigma) + cap * (1 - phi(z))

    # --- helpers -----------------------------------------------------------------------------
    def _max(self) -> float:
        kind = self.kind
        if kind == "constant":
            return self.value
        if kind == "samples":
            return max(self.samples)
        if kind == "normal":
            if self.sigma == 0:
                return self.mu
            return max(self._floor(), NormalDist(self.mu, self.sigma).inv_cdf(MAX_QUANTILE))
        if self.cap is not None:
            return self.cap
        return self._lognormal(NormalDist().inv_cdf(MAX_QUANTILE))

    def _floor(self) -> float:
        return NORMAL_FLOOR * self.mu

    def _sigma(self) -> float:
        return (math.log(self.p95) - math.log(self.p50)) / Z95

    def _lognormal(self, z: float) -> float:
        return math.exp(math.log(self.p50) + self._sigma() * z)


def _num(x: float) -> int | float:
    """Integral floats as ints, so that dumped YAML reads ``120`` rather than ``120.0``."""
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)
