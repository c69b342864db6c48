"""The optimal planner's time: one limit, and the one table of how it is shared between the steps.

Each step either ends by a share of the limit (counted from the start of the solve) or lasts at
most a share of it (counted from when it starts). The shares were measured on the scale
benchmark's families (bench/planner_scale.py); the comments say why each is what it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# Ends by this share of the limit.
TEMPLATES_END = 0.05  # re-timetabling a previous plan's or pinned group whose own timetable no longer holds
ENUMERATION_END = 0.10  # candidate enumeration: beyond it column generation prices instead
COLGEN_END = 0.45  # column generation; an unsettled LP goes on in the background for the bound (300 Hetero
# jobs s2, 30 s: plans $9,737 mean at 0.60, $9,674 at 0.50, $9,647 at 0.45; RH-300 as good or better)
MASTER_END = 0.88  # the integer master (CBC may overrun by a second); the timetables take the rest
SEARCH_END = 0.98  # every search (the neighbourhood search's end); the rest is the plan's bound and the checker's

# Lasts at most this share of the limit.
DIVE = 0.25  # diving on the LP for integer plans: a better start pays as much as search time (0.15 before:
# two dives on 300 Hetero jobs where one fitted; at 0.15 again, with the quicker search, 4 of 6 plans dearer)
NEAR = 0.10  # collecting columns of small reduced cost once the LP is optimal
DECIDE = 0.08  # deciding exactly the LP's groups of mixed training GPU counts without a round robin


@dataclass(frozen=True)
class TimeBudget:
    limit_s: float
    started: float = field(default_factory=time.perf_counter)

    @property
    def deadline(self) -> float:
        """When every search stops."""
        return self.by(SEARCH_END)

    def by(self, share: float) -> float:
        """The time.perf_counter() value at ``share`` of the limit."""
        return self.started + share * self.limit_s

    def lasting(self, share: float) -> float:
        """Seconds: ``share`` of the limit."""
        return share * self.limit_s

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started
