"""Runtime rules read from a plan's ``elastic`` block, with the defaults of DESIGN 5.

``plan.elastic`` is free-form; the keys read here are::

    long_tail_migration: {threshold: 0.8, target_share: 0.25}   # or false to switch it off
    lend_idle_gpus: true
    lend_min_gain: 2.0   # lend only when the GPU would idle this many times the round-trip switch
    rollout_shares_per_gpu: 4   # an elastic rollout's prompt groups per planned GPU (what workers pull)

``long_tail_migration`` may also carry the sim backend's tail model, ``tail_share`` (share of a
rollout's time left when the threshold share of responses is done, default 0.3) and
``tail_slowdown`` (the tail on fewer GPUs, default 1.05); ``weave simulate`` reads them. Both are
defaults of this simulator, not figures from the paper: ``weave profile fit --elastic-out`` fits them
(and the lending gain) from the records of a real elastic run, ``weave simulate --elastic-model``
reads the fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class ElasticRules:
    migrate: bool = True
    threshold: float = 0.8  # share of a rollout's responses done when the tail moves
    target_share: float = 0.25  # share of the rollout's GPUs the tail moves to
    lend: bool = True
    lend_min_gain: float = 2.0
    # A real backend splits an elastic rollout into this many prompt groups per planned GPU, pulled one
    # at a time by the GPUs it holds: finer groups balance better and leave a shorter tail, each costs
    # a round trip (and, on vLLM, a smaller batch).
    shares_per_gpu: int = 4

    @classmethod
    def off(cls) -> ElasticRules:
        return cls(migrate=False, lend=False)

    @classmethod
    def from_plan(cls, elastic: Mapping[str, Any] | None) -> ElasticRules:
        elastic = dict(elastic or {})
        if not elastic:
            return cls.off()  # a plan without an elastic block runs exactly its timetable
        ltm = elastic.get("long_tail_migration", {})
        migrate = bool(ltm) if not isinstance(ltm, Mapping) else bool(ltm.get("enabled", True))
        ltm = ltm if isinstance(ltm, Mapping) else {}
        rules = cls(
            migrate=migrate,
            threshold=float(ltm.get("threshold", 0.8)),
            target_share=float(ltm.get("target_share", 0.25)),
            lend=bool(elastic.get("lend_idle_gpus", True)),
            lend_min_gain=float(elastic.get("lend_min_gain", 2.0)),
            shares_per_gpu=int(elastic.get("rollout_shares_per_gpu", 4)),
        )
        if rules.shares_per_gpu < 1:
            raise ValueError(f"elastic.rollout_shares_per_gpu must be >= 1, got {rules.shares_per_gpu}")
        if not 0 < rules.threshold < 1:
            raise ValueError(f"elastic.long_tail_migration.threshold must be in (0, 1), got {rules.threshold}")
        if not 0 < rules.target_share <= 1:
            raise ValueError(f"elastic.long_tail_migration.target_share must be in (0, 1], got {rules.target_share}")
        return rules

    @property
    def elastic(self) -> bool:
        return self.migrate or self.lend
