"""Runtime rules read from a plan's ``elastic`` block, with the defaults of DESIGN 5.

``plan.elastic`` is free-form; the keys read here are::

    long_tail_migration: {threshold: 0.8, target_share: 0.25}   # or false to switch it off
    lend_idle_gpus: true
    lend_min_gain: 2.0   # lend only when the GPU would idle this many times the round-trip switch

``long_tail_migration`` may also carry the sim backend's tail model, ``tail_share`` (share of a
rollout's time left when the threshold share of responses is done, default 0.3) and
``tail_slowdown`` (the tail on fewer GPUs, default 1.05); ``weave simulate`` reads them. Both are
assumptions of this simulator, not figures from the paper.
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
        )
        if not 0 < rules.threshold < 1:
            raise ValueError(f"elastic.long_tail_migration.threshold must be in (0, 1), got {rules.threshold}")
        if not 0 < rules.target_share <= 1:
            raise ValueError(f"elastic.long_tail_migration.target_share must be in (0, 1], got {rules.target_share}")
        return rules

    @property
    def elastic(self) -> bool:
        return self.migrate or self.lend
