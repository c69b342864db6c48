"""The group rules: when jobs may share a co-execution group, in one place.

A group holds at most ``max_group_size`` jobs, a training pool (nodes of one cluster, as many as its
widest member's option) and rollout classes (members that share rollout nodes, one cluster each);
a narrower member takes a run of its pool's or class's nodes. Under the group's cap, the least
``slo * solo`` of its members (``group_cap``), it may run when:

1. every member's own loop (rollout, train, sync per cycle) fits the cap (``fits_cap``);
2. on every node of the pool and of each class, the phases laid there (``class_layout``), each with
   a warm switch where the node is shared (``load_s``), fit the cap, and their host memory fits the
   node's (``fits_memory``);
3. a timetable exists whose cycle meets every member's SLO (``meets_slo``): planner/columns.py
   checks it on the groups a master chooses.

``group_fits`` checks rules 1-2 on one group. Every module that forms groups decides by these
functions: candidate enumeration and the one constructor (planner/optimal.py), exact and greedy
pricing (pricing.py, colgen.py), shared pools (colocated.py), admission (admission.py), the baselines (baselines.py) and the rejection reasons (reasons.py).
Depth-first searches keep running sums for speed and compare them with ``fits_cap`` and
``fits_memory``, or with ``TIME_TOL`` in vectorised form. The tolerances are round-off only: plans
are solved at millisecond resolution and written in whole milliseconds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from weave_rl.planner.model import PlanningModel
    from weave_rl.planner.optimal import CandidateBuilder, PhaseOption
    from weave_rl.profiles.jobs import JobSpec

SLO_TOL = 1e-9  # relative, on a cycle against ``slo * solo``
TIME_TOL = 1e-9  # seconds, on busy times and loops against a cap
MEM_TOL = 1e-9  # relative, on host memory against a node's


def member_cap(model: "PlanningModel", job: "JobSpec") -> float:
    """The longest cycle a job's SLO admits: ``slo`` times its solo iteration."""
    return job.slo * model.solo_of(job)


def group_cap(caps: Iterable[float]) -> float:
    """A group's cycle serves every member: the least of their caps."""
    return min(caps)


def load_s(option: "PhaseOption", shared: bool) -> float:
    """A phase's busy time on its nodes per cycle: its duration, and a warm switch where shared."""
    return option.duration_s + (option.switch_s if shared else 0.0)


def fits_cap(seconds, cap):
    """A busy time or loop within a cap (floats or numpy arrays)."""
    return seconds <= cap + TIME_TOL


def meets_slo(cycle_s: float, cap: float) -> bool:
    """A timetable's cycle within a member's cap."""
    return cycle_s <= cap * (1 + SLO_TOL)


def fits_memory(gb: float, node_gb: float) -> bool:
    """Host memory pinned on a node within the node's."""
    return gb <= node_gb * (1 + MEM_TOL)


def class_layout(opts: Sequence["PhaseOption"], cap: float, node_mem_gb: float) -> tuple[int, ...] | None:
    """Rule 2 for one rollout class (or training pool): each phase's first node on a run of
    consecutive nodes among the ``max(nodes)`` nodes, so that every node's load and host memory
    fit; None when no layout fits."""
    width = max(o.nodes for o in opts)
    if not fits_cap(sum(o.duration_s * o.nodes for o in opts), cap * width):
        return None  # more busy time than the nodes have, on any layout
    return least_busy_layout(tuple(opts), node_mem_gb, cap + TIME_TOL)[1]


def least_busy_layout(opts: tuple["PhaseOption", ...], node_mem_gb: float,
                      within: float = math.inf) -> tuple[float, tuple[int, ...] | None]:
    """The layout of least busiest-node time whose host memory fits, and that time (inf, None when
    none fits, or none within ``within`` seconds). Exhaustive over the runs' first nodes (groups are
    small); ``within`` only cuts branches that could not be within it, so the layout is the same
    whenever one is. Not cached: pricing lays out half a million classes and pools in 30 s on 300
    Hetero jobs, nearly all different (a cache hit 130 of them); the cut is what makes it affordable."""
    width = max(o.nodes for o in opts)
    shared = len(opts) > 1
    if all(o.nodes == width for o in opts):  # every phase on every node
        busy = sum(load_s(o, shared) for o in opts)
        fits = fits_memory(sum(o.host_mem_gb for o in opts), node_mem_gb) and busy <= within
        return (busy, (0,) * len(opts)) if fits else (math.inf, None)
    # Depth first, widest phases first, identical phases at non-decreasing first nodes; a branch is
    # cut when a node it loads would already exceed the best (at first ``within``): its busy time, and
    # its switches once two phases share it (nodes only gain phases deeper down). Ties go to the
    # lexicographically least layout, as a plain enumeration in order would give.
    n = len(opts)
    order = sorted(range(n), key=lambda i: -opts[i].nodes)
    spans = [opts[i].nodes for i in order]
    durations = [opts[i].duration_s for i in order]
    switches = [opts[i].switch_s for i in order]
    mems = [opts[i].host_mem_gb for i in order]
    same = [k > 0 and opts[order[k - 1]] == opts[order[k]] for k in range(n)]
    mem_cap = node_mem_gb * (1 + MEM_TOL)
    busy, switch, users, mem = [0.0] * width, [0.0] * width, [0] * width, [0.0] * width
    first = [0] * n
    best: list = [within, None]

    def place(k: int) -> None:
        if k == n:
            worst = max(busy[u] + switch[u] if users[u] > 1 else busy[u] for u in range(width))
            if best[1] is None:
                if worst <= within:
                    best[0], best[1] = worst, tuple(first)
            elif worst < best[0] - 1e-12 or (worst <= best[0] + 1e-12 and tuple(first) < best[1]):
                best[0], best[1] = worst, tuple(first)
            return
        i, span, d, sw, m = order[k], spans[k], durations[k], switches[k], mems[k]
        limit = best[0] + 1e-12
        for f in range(first[order[k - 1]] if same[k] else 0, width - span + 1):
            for u in range(f, f + span):
                if mem[u] + m > mem_cap or busy[u] + d + (switch[u] + sw if users[u] else 0.0) > limit:
                    break
            else:
                for u in range(f, f + span):
                    busy[u] += d
                    switch[u] += sw
                    users[u] += 1
                    mem[u] += m
                first[i] = f
                place(k + 1)
                for u in range(f, f + span):
                    busy[u] -= d
                    switch[u] -= sw
                    users[u] -= 1
                    mem[u] -= m
                limit = best[0] + 1e-12

    place(0)
    return (best[0], best[1]) if best[1] is not None else (math.inf, None)


def group_fits(builder: "CandidateBuilder", jobs: Sequence[int], trains: Sequence["PhaseOption"],
               rollouts: Sequence["PhaseOption"], classes: Sequence[Sequence[int]]) -> bool:
    """Rules 1-2 on one group: ``trains`` and ``rollouts`` per member, ``classes`` as positions in
    ``jobs`` (every position in exactly one)."""
    if not jobs or len(jobs) > builder.k or sorted(i for c in classes for i in c) != list(range(len(jobs))):
        return False
    cap = group_cap(builder.cap[j] for j in jobs)
    if len({t.cluster for t in trains}) > 1 or \
            not all(fits_cap(builder.loop_s(j, t, r), cap) for j, t, r in zip(jobs, trains, rollouts)):
        return False
    node_mem = builder.topo.clusters
    if class_layout(trains, cap, node_mem[trains[0].cluster].host_mem_gb) is None:
        return False
    for cls in classes:
        opts = [rollouts[i] for i in cls]
        if len({o.cluster for o in opts}) > 1 or class_layout(opts, cap, node_mem[opts[0].cluster].host_mem_gb) is None:
            return False
    return True
