"""Exact timetables of small groups by enumeration: each shared GPU set's cyclic order, then a
difference-constraint system per order (planner/timetable.py's model, decided without CP-SAT).

Each phase (job, rollout | train) gets a start ``z`` in ``[0, C)``. With one phase fixed at 0 (any
timetable rotates so), a timetable fixes
- on every shared GPU set, the order of its phases by ``z``: consecutive phases ``p, q`` need
  ``z_q - z_p >= d_p + sw_q`` and the last and first ``z_first + C - z_last >= d_last + sw_first``
  (switch-extended arcs disjoint on the circle);
- per job, how many whole cycles ``w`` lie between its rollout's start and its train's on the
  line: ``dR <= z_t - z_r + w C <= k C - dT - dS`` (``k = 1 + max_staleness``, so ``0 <= w <= k``).
Given those choices every constraint is ``z_b - z_a >= c0 + c1 C`` with ``c1 <= 0`` on the right
of a lower bound: feasible at ``C`` means feasible at any larger ``C``. A depth-first search over
the choices keeps the longest-path closure of the constraints (no positive cycle = feasible) and
prunes a partial choice as soon as it has one; the least cycle is found by deciding ever smaller
cycles, each found order's own least cycle by bisection.

Hard, tight groups of three (their load within 0.03-2 % of the cap) take CP-SAT 1-30 s to decide;
here their few hundred orders take milliseconds. A search that exceeds its node budget gives no
answer (the caller falls back to CP-SAT).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Edge = tuple[int, int, int, int]  # (a, b, c0, c1): z_b - z_a >= c0 + c1 * C


class OutOfBudget(Exception):
    pass


@dataclass
class Cyclic:
    """The least cycle (ms) and each phase's start in ``[0, cycle)``; ``cycle`` None: infeasible."""
    cycle: int | None
    starts: dict[tuple[str, str], int]


def least_cycle(names: list[str], dur: dict[str, dict[str, int]], sw: dict[tuple[str, str], int],
                stale: dict[str, int], resources: list[list[tuple[str, str]]], lb: int, ub: int,
                node_budget: int = 20_000, least: bool = True) -> Cyclic | None:
    """The least cycle in ``[lb, ub]`` (ms) of the group's timetable model (without ``least``: the
    first order found, at its own least cycle), or infeasible; None when the search needs more than
    ``node_budget`` constraint additions."""
    search = _Search(names, dur, sw, stale, resources, node_budget)
    best: tuple[int, list[Edge]] | None = None
    target = ub
    try:
        while target >= lb:
            edges = search.decide(target)
            if edges is None:
                break
            cycle = search.least_for(edges, lb, target)
            best, target = (cycle, edges), (cycle - 1 if least else lb - 1)
    except OutOfBudget:
        return None
    if best is None:
        return Cyclic(None, {})
    cycle, edges = best
    closure = search.closure(edges, cycle)
    return Cyclic(cycle, {p: int(closure[0, i]) for p, i in search.index.items()})


class _Search:
    def __init__(self, names, dur, sw, stale, resources, node_budget: int):
        self.phases = [(n, k) for n in names for k in ("rollout", "train")]
        self.index = {p: i + 1 for i, p in enumerate(self.phases)}  # 0: the origin, z = 0
        self.size = len(self.phases) + 1
        self.dur, self.sw, self.names = dur, sw, names
        self.k = {n: 1 + stale[n] for n in names}
        sets = [list(r) for r in {frozenset(r): r for r in resources}.values()]
        # Only maximal sets matter: a subset's arcs are disjoint when its superset's are.
        self.classes = sorted((r for r in sets if not any(set(r) < set(o) for o in sets)), key=len, reverse=True)
        self.left = node_budget

    def base(self) -> list[Edge]:
        edges = []
        for p, i in self.index.items():
            edges += [(0, i, 0, 0), (i, 0, 1, -1)]  # 0 <= z_p <= C - 1
        if self.classes:  # rotation: the first class's first phase at 0
            edges.append((self.index[self.classes[0][0]], 0, 0, 0))
        return edges

    def arc(self, p, q) -> Edge:
        """q's switch-extended arc after p's."""
        return (self.index[p], self.index[q], self.dur[p[0]][p[1]] + self.sw[q], 0)

    def decide(self, cycle: int) -> list[Edge] | None:
        """A choice of orders and wraps feasible at ``cycle`` (its edges), or None."""
        edges = self.base()
        closure = self.closure(edges, cycle)
        if closure is None:
            return None
        return self._orders(closure, edges, cycle, 0, [])

    def _orders(self, closure, edges, cycle, ci, partial):
        if ci == len(self.classes):
            return self._wraps(closure, edges, cycle, 0)
        cls = self.classes[ci]
        if len(partial) == len(cls):
            first, last = partial[0], partial[-1]
            wrap = (self.index[last], self.index[first], self.dur[last[0]][last[1]] + self.sw[first], -1)
            nxt = self._add(closure, wrap, cycle)
            return None if nxt is None else self._orders(nxt, edges + [wrap], cycle, ci + 1, [])
        options = [cls[0]] if ci == 0 and not partial else [p for p in cls if p not in partial]
        for p in options:
            if partial:
                edge = self.arc(partial[-1], p)
                nxt = self._add(closure, edge, cycle)
                if nxt is None:
                    continue
                found = self._orders(nxt, edges + [edge], cycle, ci, partial + [p])
            else:
                found = self._orders(closure, edges, cycle, ci, [p])
            if found is not None:
                return found
        return None

    def _wraps(self, closure, edges, cycle, ni):
        if ni == len(self.names):
            return edges
        n = self.names[ni]
        r, t, d, k = self.index[(n, "rollout")], self.index[(n, "train")], self.dur[n], self.k[n]
        for w in range(k + 1):
            pair = [(r, t, d["rollout"], -w), (t, r, d["train"] + d["sync"], w - k)]
            nxt = self._add(closure, pair[0], cycle)
            nxt = None if nxt is None else self._add(nxt, pair[1], cycle)
            if nxt is not None:
                found = self._wraps(nxt, edges + pair, cycle, ni + 1)
                if found is not None:
                    return found
        return None

    def _add(self, closure: np.ndarray, edge: Edge, cycle: int) -> np.ndarray | None:
        """The closure with ``edge`` added, or None on a positive cycle."""
        self.left -= 1
        if self.left < 0:
            raise OutOfBudget
        a, b, c0, c1 = edge
        c = c0 + c1 * cycle
        if closure[b, a] + c > 0:
            return None
        return np.maximum(closure, closure[:, a, None] + (c + closure[b]))

    def closure(self, edges: list[Edge], cycle: int) -> np.ndarray | None:
        """Longest paths (``closure[a, b]``: the least ``z_b - z_a``; -inf: none), or None on a
        positive cycle."""
        closure = np.full((self.size, self.size), -np.inf)
        np.fill_diagonal(closure, 0.0)
        for edge in edges:
            closure = self._add(closure, edge, cycle)
            if closure is None:
                return None
        return closure

    def least_for(self, edges: list[Edge], lo: int, hi: int) -> int:
        """The least cycle in ``[lo, hi]`` at which ``edges`` (feasible at ``hi``) are feasible."""
        if self.feasible(edges, lo):  # the usual case: the lower bound
            return lo
        while hi - lo > 1:  # lo infeasible, hi feasible
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.feasible(edges, mid) else (mid, hi)
        return hi

    def feasible(self, edges: list[Edge], cycle: int) -> bool:
        """No positive cycle (Bellman-Ford from the origin, which reaches every phase)."""
        weighted = [(a, b, c0 + c1 * cycle) for a, b, c0, c1 in edges]
        z = [0] + [-(1 << 60)] * (self.size - 1)
        for _ in range(self.size):
            changed = False
            for a, b, c in weighted:
                if z[a] + c > z[b]:
                    z[b] = z[a] + c
                    changed = True
            if not changed:
                return True
        return False
