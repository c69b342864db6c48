"""Exact pricing speed: complete pricings of column generation at fixed duals, on Hetero jobs.

Run from the repository root::

    .venv/bin/python -m bench.pricing_speed [--jobs 300] [--seeds 1,2,3] [--rounds 20]

Per seed (``weave jobs generate hetero``, on the scale benchmark's topology): the LP over every job
alone, greedy pricing until it dries up, then ``--rounds`` rounds of exact pricing that stop at 300
columns, as column generation's early rounds do. None of it has a deadline, so the duals it reaches
are the same on every machine and every run. At those duals: one complete pricing in one process,
each leader's best group (as the background proof runs it), first with no layouts cached, then
again with the layouts of the first (as in a solve, where each pass meets most layouts again).

Prints the LP value, both wall times, the search nodes, and the Lagrangian bound at those duals.
Wall times compare between commits only in one session on one machine (ours are shared and
noisy); the nodes and the bound are exact, and change only when the search itself does.
"""

from __future__ import annotations

import argparse
import math
import time

from bench.planner import table
from bench.planner_scale import topology_for
from weave_rl.planner.colgen import LpMaster, max_groups, price_greedy, reject_penalty
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import CandidateBuilder, _admissible
from weave_rl.planner.optimize import PER_LEADER, _candidate_column, _singletons
from weave_rl.planner.pricing import price_exact
from weave_rl.profiles.generators import generate

STOP_AFTER = 300  # columns per early round of column generation (planner/optimize.py)


def duals_after(builder: CandidateBuilder, lp: LpMaster, rounds: int) -> tuple[float, dict, dict]:
    """The LP's value and duals after greedy pricing dries up and ``rounds`` early exact rounds."""
    seen: set = set()

    def add(cands) -> int:
        fresh = [column for column in map(lambda c: _candidate_column(c, {}), cands) if column.key not in seen]
        for column in fresh:
            seen.add(column.key)
            lp.add(column)
        return len(fresh)

    add(_singletons(builder))
    value, pi, mu = lp.solve()
    while add(price_greedy(builder, pi, mu, extra={})) >= 10:  # until the heuristic dries up, as in a solve
        value, pi, mu = lp.solve()
    rotation: dict = {}
    for _ in range(rounds):
        priced = price_exact(builder, pi, mu, extra={}, deadline=math.inf, stop_after=STOP_AFTER,
                             rotation=rotation, per_leader=PER_LEADER)
        if not add(priced.columns):
            break
        value, pi, mu = lp.solve()
    return value, pi, mu


def complete_pricing(builder: CandidateBuilder, pi: dict, mu: dict):
    """One complete pricing (each leader's best group): (wall seconds, the pricing)."""
    began = time.perf_counter()
    priced = price_exact(builder, pi, mu, extra={}, deadline=math.inf, max_columns=len(pi) + 1, per_leader=1)
    return time.perf_counter() - began, priced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        jobs = generate("hetero", args.jobs, seed)
        topo = topology_for(args.jobs, jobs)
        model = PlanningModel(topo, jobs)
        _, job_ids = _admissible(model)
        builder = CandidateBuilder(model, job_ids, 5)
        lp = LpMaster(job_ids, topo, reject_penalty(topo))
        value, pi, mu = duals_after(builder, lp, args.rounds)
        builder.laid_out.clear()
        cold_s, _ = complete_pricing(builder, pi, mu)
        warm_s, priced = complete_pricing(builder, pi, mu)
        bound = value + max(max_groups(topo, len(job_ids)) * priced.rc_lower_bound, priced.rc_sum_bound)
        rows.append([f"Hetero-{args.jobs} s{seed}", f"${value:,.2f}", f"{cold_s:.2f}", f"{warm_s:.2f}",
                     f"{priced.nodes:,}", f"{priced.rc_lower_bound:.3f}", f"${bound:,.2f}"])
    print(table(f"Complete exact pricing after {args.rounds} early rounds (one process)", ["instance", "LP", "cold s", "warm s", "nodes", "least rc", "bound"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
