"""Large neighbourhood search on the set-partitioning master: an integer plan improved by solving
small parts of it exactly (at 300 jobs CBC over every column is slow: its search tree is wide). Each round:

1. a neighbourhood: a random group of the incumbent, grown by the groups of the jobs that share a
   column with its jobs (mostly columns the LP used) until about ``size`` jobs, rejected jobs always in;
2. the sub-problem: every column (not banned) inside it, each job covered once or rejected at the
   master's penalty, within the nodes (and ``exclusive`` sets) the rest of the plan leaves;
3. CP-SAT from the current groups as hint; a cheaper answer replaces them once ``accept`` agrees
   (the caller checks each new group's timetable). A neighbourhood proven optimal is not solved again
   while the rest leaves it the same nodes (15 % of the rounds at 300 RH jobs drew one again).
Columns that come meanwhile (``more``: column generation in the background) join at each round. With
``price``, every other neighbourhood is instead the groups furthest above the LP, and new columns for
its jobs alone are priced before it is solved: the LP's columns rarely group what a plan leaves over.

From the dive's plan of the 300-job BL s1 and Mixed s3 masters (3.4 % and 4.1 % above the LP
bound), 10 s of this reached 1.4 % and 2.0 %, 14 s of CBC over every column 2.0-3.0 % and 2.3 %.
Masters of at most 8,000 columns go to CBC first (planner/optimize.py). One search runs in process
(two forked ones found the same plans on 7 of 8 instances, and took the background pricing's core).
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Mapping

from weave_rl.planner.colgen import solve_integer
from weave_rl.planner.columns import Column, Incumbent
from weave_rl.topology.topology import Topology


def improve(columns: list[Column], job_ids: list[int], topo: Topology, start: Incumbent, *, banned: set[int],
            penalty: float, deadline: float, exclusive: list[list[int]] = (), support: Mapping[int, list[int]] = None,
            size: int = 30, round_limit_s: float = 0.5, seed: int = 0,
            accept: Callable[[list[int]], bool] | None = None, more: Callable[[], list[int]] = list,
            price: Callable[[set[int]], list[int]] | None = None, duals: tuple | None = None) -> Incumbent:
    """A plan no dearer than ``start`` (the same one when nothing better is found by ``deadline``).
    ``support``: job -> columns the LP used (neighbourhoods follow them first). ``accept(new)`` may
    refuse an improvement for its new columns (and add them to ``banned``, which is read afresh).
    ``more()``: the columns appended to ``columns`` since it was last called (new rounds take them).
    ``price(area)`` appends columns for the area's jobs alone; ``duals``: the LP's (pi, mu)."""
    rng = random.Random(seed)
    by_job: dict[int, list[int]] = {j: [] for j in job_ids}
    for i, col in enumerate(columns):
        if i not in banned:
            for j in col.jobs:
                by_job[j].append(i)
    support = support or {}
    exclusive_of: dict[int, list[int]] = {}
    for k, group in enumerate(exclusive):
        for i in group:
            exclusive_of.setdefault(i, []).append(k)
    chosen, rejected = list(start.columns), set(start.rejected)
    cost = _cost(columns, chosen, rejected, penalty)
    proven: set[tuple] = set()  # neighbourhoods solved to their start, with what the rest left them
    worst = False  # every other round
    while time.perf_counter() < deadline - 0.05 and chosen:
        worst = not worst and price is not None and duals is not None
        group_of = {j: i for i in chosen for j in columns[i].jobs}
        area = _worst(columns, chosen, rejected, duals, size, rng) if worst else \
            _neighbourhood(columns, chosen, rejected, group_of, by_job, support, size, rng)
        for i in more() + (price(area) if worst else []):
            for j in columns[i].jobs:
                by_job[j].append(i)
        inside = {i for i in chosen if set(columns[i].jobs) <= area}
        fixed = [i for i in chosen if i not in inside]
        used = {c: 0 for c in topo.clusters}
        for i in fixed:
            for c, n in columns[i].nodes:
                used[c] += n
        taken_sets = frozenset(k for i in fixed for k in exclusive_of.get(i, ()))
        key = (frozenset(inside), frozenset(rejected & area), tuple(used.values()), taken_sets)
        if key in proven:
            continue
        answer = _solve(columns, area, inside, used, taken_sets, rejected & area, by_job, banned, topo, penalty,
                        exclusive, exclusive_of, min(round_limit_s, deadline - time.perf_counter()))
        if answer is None:
            continue
        new_columns, new_rejected = answer.chosen, set(answer.rejected)
        if answer.status == "OPTIMAL" and set(new_columns) == inside:
            proven.add(key)
        new_cost = _cost(columns, fixed + new_columns, (rejected - area) | new_rejected, penalty)
        if new_cost < cost - 1e-6 and (accept is None or accept([i for i in new_columns if i not in inside])):
            chosen, rejected, cost = fixed + new_columns, (rejected - area) | new_rejected, new_cost
    return Incumbent(chosen, sorted(rejected), cost)


Decide = Callable[[int, float], Any]  # (column, seconds) -> its verdict, with ``.ok`` (a timetable)
DECIDE_S = 0.3  # the most one new column's verdict may take (a column undecided then counts as without)


def search(columns: list[Column], job_ids: list[int], topo: Topology, start: Incumbent, *, banned: set[int],
           penalty: float, deadline: float, exclusive: list[list[int]], support: Mapping[int, list[int]],
           seed: int, decide: Decide, known: dict[int, Any], more: Callable[[], list[int]] = list,
           price: Callable[[set[int]], list[int]] | None = None, duals: tuple | None = None) -> Incumbent:
    """``improve`` taking an improvement only once ``decide`` accepts each of its new columns.
    ``known`` caches the verdicts and gains the new ones; a column refused joins ``banned``."""

    def accept(new: list[int]) -> bool:
        for i in new:
            if i not in known:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return False
                known[i] = decide(i, min(DECIDE_S, left))
            if not known[i].ok:
                banned.add(i)
                return False
        return True

    return improve(columns, job_ids, topo, start, banned=banned, penalty=penalty, deadline=deadline,
                   exclusive=exclusive, support=support, seed=seed, accept=accept, more=more, price=price,
                   duals=duals)


def _cost(columns: list[Column], chosen: list[int], rejected: set[int], penalty: float) -> float:
    return sum(columns[i].objective for i in chosen) + penalty * len(rejected)


def _worst(columns, chosen, rejected, duals, size, rng) -> set[int]:
    """The jobs of the groups furthest above the LP (reduced cost at its ``duals``), up to ``size``, rejected
    jobs always in; each ranked with noise of three mean excesses (a factor on each drew the same few)."""
    pi, mu = duals
    over = {i: columns[i].objective - sum(pi.get(j, 0.0) for j in columns[i].jobs)
            - sum(mu.get(c, 0.0) * n for c, n in columns[i].nodes) for i in chosen}
    spread = 3 * sum(max(0.0, e) for e in over.values()) / len(over)
    area: set[int] = set(rejected)
    for i in sorted(chosen, key=lambda i: -(over[i] + spread * rng.random())):
        if len(area) + len(columns[i].jobs) <= size:
            area.update(columns[i].jobs)
    return area


def _neighbourhood(columns, chosen, rejected, group_of, by_job, support, size, rng) -> set[int]:
    area: set[int] = set(rejected)
    seed = rng.choice(chosen)
    area.update(columns[seed].jobs)
    frontier = list(area)
    while len(area) < size and frontier:
        j = frontier.pop(rng.randrange(len(frontier)))
        links = support.get(j) if support.get(j) and rng.random() < 0.8 else by_job[j]
        for i in rng.sample(links, min(10, len(links))):
            for other in columns[i].jobs:
                g = group_of.get(other)
                if g is not None and other not in area and len(area) < size:
                    added = columns[g].jobs
                    area.update(added)
                    frontier.extend(added)
    return area


def _solve(columns, area, inside, used, taken_sets, rejected, by_job, banned, topo, penalty, exclusive, exclusive_of,
           limit_s):
    """Optimal cover of ``area`` by columns inside it, given the nodes the rest of the plan ``used``
    and the ``exclusive`` sets it took; None when CP-SAT found nothing in time."""
    candidates = sorted({i for j in area for i in by_job[j] if i not in banned and set(columns[i].jobs) <= area
                         and not taken_sets.intersection(exclusive_of.get(i, ()))})
    # One worker: on models this small it is quicker than a portfolio.
    answer = solve_integer(columns, sorted(area), topo, allowed=candidates, penalty=penalty, time_limit_s=limit_s,
                           threads=1, hint=Incumbent(sorted(inside), sorted(rejected)), exclusive=exclusive,
                           used=used, small=True)
    return answer if answer.objective is not None else None
