"""The neighbourhood search on the master (planner/lns.py), on masters small enough to solve by hand.

weave-testbed has 41 rollout and 41 training nodes. Columns: every job alone for $10/h on one
training node, and pairs for $12/h on one training node.
"""

from __future__ import annotations

import time

import pytest

from weave_rl.planner.columns import Column, Incumbent
from weave_rl.planner.lns import improve
from weave_rl.topology.topology import load_topology

TESTBED = load_topology("weave-testbed")
PENALTY = 1_000.0


def master(pairs, jobs=4, train_nodes_per_pair=1):
    columns = [Column((j,), (("train", 1),), 10.0) for j in range(jobs)]
    columns += [Column(tuple(p), (("train", train_nodes_per_pair),), 12.0) for p in pairs]
    return columns


def run(columns, start, jobs=4, topo=TESTBED, deadline_s=5.0, **kw):
    return improve(columns, list(range(jobs)), topo, start, penalty=PENALTY, deadline=time.perf_counter() + deadline_s,
                   **{"banned": set(), **kw})


def test_singletons_become_pairs():
    columns = master([(0, 1), (2, 3)])
    best = run(columns, Incumbent([0, 1, 2, 3], []))
    assert sorted(best.columns) == [4, 5]
    assert best.objective == pytest.approx(24.0)
    assert best.rejected == []


def test_a_rejected_job_is_placed():
    columns = master([(0, 1)])
    best = run(columns, Incumbent([4, 2], [3]))  # $22 + one rejection
    assert best.rejected == []
    assert best.objective == pytest.approx(12 + 10 + 10)


def test_banned_columns_stay_out():
    columns = master([(0, 1), (2, 3)])
    best = run(columns, Incumbent([0, 1, 2, 3], []), banned={4})
    assert sorted(best.columns) == [0, 1, 5]
    assert best.objective == pytest.approx(32.0)


def test_node_counts_hold():
    # Each pair takes 30 training nodes: with 41, only one pair fits beside two singletons.
    columns = master([(0, 1), (2, 3)], train_nodes_per_pair=30)
    best = run(columns, Incumbent([0, 1, 2, 3], []))
    assert best.objective == pytest.approx(12 + 10 + 10)
    assert sum(n for i in best.columns for _, n in columns[i].nodes) <= 41


def test_at_most_one_column_of_an_exclusive_set():
    columns = master([(0, 1), (2, 3)])
    best = run(columns, Incumbent([0, 1, 2, 3], []), exclusive=[[4, 5]])
    assert best.objective == pytest.approx(32.0)


def test_columns_that_come_during_the_search_are_taken():
    # Pairs (0, 1) and (2, 3) come only after the search began (``more``, as column generation in
    # the background sends them): the search then pairs the jobs, $24 instead of $40.
    columns = master([])
    arrivals = [[], [], [Column((0, 1), (("train", 1),), 12.0), Column((2, 3), (("train", 1),), 12.0)]]

    def more():
        fresh = arrivals.pop(0) if arrivals else []
        columns.extend(fresh)
        return list(range(len(columns) - len(fresh), len(columns)))

    best = run(columns, Incumbent([0, 1, 2, 3], []), deadline_s=2.0, more=more)
    assert sorted(best.columns) == [4, 5] and best.objective == pytest.approx(24.0)
    assert not arrivals


def test_never_dearer_than_the_start_and_stops_at_the_deadline():
    columns = master([])  # nothing to improve
    started = time.perf_counter()
    best = improve(columns, [0, 1, 2, 3], TESTBED, Incumbent([0, 1, 2, 3], []), banned=set(), penalty=PENALTY,
                   deadline=started + 0.5)
    assert time.perf_counter() - started < 1.5
    assert sorted(best.columns) == [0, 1, 2, 3] and best.objective == pytest.approx(40.0)


def test_a_search_takes_only_decided_columns_and_keeps_the_bans():
    # Pair (0, 1) has no timetable: banned, its verdict kept; the best plan uses pair (2, 3).
    from weave_rl.planner.lns import search
    from weave_rl.planner.timetable import Timetable

    def decide(i, limit_s):
        return Timetable("INFEASIBLE" if i == 4 else "FEASIBLE")

    columns = master([(0, 1), (2, 3)])
    banned, timetables = set(), {}
    best = search(columns, list(range(4)), TESTBED, Incumbent([0, 1, 2, 3], [], 40.0), banned=banned,
                  penalty=PENALTY, deadline=time.perf_counter() + 2.5, exclusive=[], support={}, seed=0,
                  decide=decide, known=timetables)
    assert sorted(best.columns) == [0, 1, 5]
    assert best.objective == pytest.approx(32.0)
    assert 4 in banned and not timetables[4].ok and timetables[5].ok


def test_a_neighbourhood_proven_optimal_is_not_solved_again(monkeypatch):
    # Jobs 2 and 3 share no column with another job: the neighbourhoods are {0, 1}, {2} and {3}, each
    # the best of its columns from the start, and drawn again and again in 0.5 s.
    import weave_rl.planner.lns as lns

    calls = []
    solve = lns._solve
    monkeypatch.setattr(lns, "_solve", lambda *args: calls.append(args) or solve(*args))
    best = run(master([(0, 1)]), Incumbent([4, 2, 3], []), deadline_s=0.5)
    assert sorted(best.columns) == [2, 3, 4] and best.objective == pytest.approx(32.0)
    assert sorted(sorted(args[1]) for args in calls) == [[0, 1], [2], [3]]
