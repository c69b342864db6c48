"""The ``optimal`` policy, cost objective: set partitioning over co-execution groups.

1. Columns: the weave heuristic's groups and the groups of a previous plan (``start``) as templates
   (so the result is never worse than either), pinned groups (``replan`` keeps them), and candidate
   groups (planner/optimal.py): all of them when the enumeration fits its budget, else those that
   column generation prices (planner/colgen.py); and every job alone with its rollout and train
   taking turns on the same GPUs (the ``colocate`` policy's group, planner/colocated.py) or, where
   both share a node, as the ``solo`` policy lays it out (so no baseline places a job it cannot).
2. Integer master (CP-SAT, or CBC through PuLP): each job in one group or rejected, node counts per
   cluster within the topology; it places as many jobs as it can, then minimises $/h plus any
   migration charge. The best known plan (the heuristic's, the previous one, or the LP rounded by
   diving) is its hint. After column generation, a master of at most 8,000 columns is solved
   whole by CBC for all its time (measured on 100 RH jobs: 1.0-1.7 % above the LP, against
   1.8-4.9 % for the search below). A larger one first sees the 2,000 columns of least reduced
   cost (plus every single-job column): far quicker to good plans than all of them, and the bound
   does not depend on it; then a large neighbourhood search (planner/lns.py, one per thread in
   forked processes) improves its plan over every column. ``solver="auto"`` picks CBC there and
   CP-SAT for complete enumerations.
3. Every chosen group gets a timetable: the round robin when it meets every SLO, else the exact
   CP-SAT timetable (planner/timetable.py). A group without one is banned and the master re-solved.

Lower bound, always valid for the model (reported as ``lower_bound_usd_per_hour`` and the gap):
- complete enumeration: the better of the integer master's own bound and the LP relaxation's (a
  master of more than 3,000 columns is then solved by CBC like a column-generation master);
- otherwise: column generation's Lagrangian bound at its last complete pricing (LP value plus the
  per-leader sum of least reduced costs, planner/pricing.py; equal to the LP optimum once the exact
  pricing proves that no column improves; column generation stops once it is within ``CG_GAP``);
- and never below the work bound ``sum_j (r_j $R_j + t_j $T_j) / (slo_j solo_j)``, the packing
  bound (nodes as bins, dual feasible functions: planner/optimal.py), when column generation
  proved nothing, the halves' bound (training pools and rollout classes packed apart: planner/halves.py),
  nor, where it applies, the LP by pairs' bound with the halves' by whole nodes (planner/pairlp.py).
With rejections the bound is on plans that place as many jobs (the plan's note says how many).
The colocated groups are in the LP from the start (no negative reduced cost at its optimum), so
column generation's bound covers them; the work and packing bounds charge each job its colocated
option too, and the halves' and the pairs' bounds, which know no colocation, are lowered by what
colocating jobs could save (``_allow_colocation``).

When column generation proves nothing in its time (300 RH jobs in 30 s: its pricing never
completes), its LP is not dived on; the plan built half by half (planner/halves.py: the cheapest
rollout classes, then those classes packed into training pools) starts the integer master instead:
there it is 1-3 % cheaper than the dives' plan. That holds where no cluster hosts both kinds of
phase; elsewhere (Hetero, some of whose jobs may roll out on training GPUs) the unsettled LP is
dived on as usual. Where every job has one option of one node per
phase (planner/regroup.py), column generation that stalls (its LP falling by under 1 % in the last
7 % of the limit, from 25 % of it on, nothing proven) stops there, and windows of the plan by
halves are re-cut exactly until 84 % of the limit, every new group timetabled (measured on 300 RH
jobs before the LP by pairs below: from $5,733 / $5,820 / $5,686 to $5,638-5,653 / $5,699 /
$5,549). Masters whose LP settles keep the dives.

Where besides no rollout node ever holds three jobs (RH), the same LP is solved first *by pairs*
(planner/pairlp.py): a pricing that knows a group is a training node plus one rollout node per job,
less one per pair. On 100 RH jobs it settles in under a second; column generation then runs as
usual (the pairs' bound, by whole nodes, may round its LP up). When it has not settled by 15 % of
the limit (300 RH jobs), column generation, which would not settle either, is skipped: the LP by
pairs goes on in a forked process until 84 % of the limit while the plan by halves is regrouped
with one thread fewer (on one thread it stops at 30 % instead), and its Lagrangian bound with the
halves', by whole nodes, is the bound.

Integer plans: the LP is dived on, fixing a few columns per round and pricing (greedily) the jobs
left after every round, so the columns that complete a partial plan exist when they are needed;
that plan is the hint of the integer master. Then it dives again from the same LP, ranking the
fractional columns by value times a random factor: for the rest of the dive's time when the master
is solved whole, else for a third of it more. CP-SAT merges every dive's plan (the cheapest plan
over the union of their columns and the LP's support, within a second) for a master solved whole;
a larger one keeps the cheapest dive and leaves the rest to the neighbourhood search.
A dive cut short (time, or GLOP failing twice) is completed by rounding its last LP solution, the
jobs left over covered by groups of their own.

Time: enumeration <= 10 %, the plan by halves <= 12 % (its regrouping until 84 %, the training half's
LP <= 10 %), the LP by pairs until 15 % (then in its process until 84 %), column generation until
60 % of the limit,
the dive <= 15 %, the integer master up to 88 % (CBC may overrun its limit by a second while it
stops), the timetables the rest
(most settle at their lower bound in milliseconds); when no plan is verified in time,
``NoPlanInTime`` (the API falls back to the weave policy).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from weave_rl.planner.colgen import (IntegerResult, LpMaster, LpTrouble, make_candidate, max_groups, price_greedy,
                            reject_penalty, solve_integer)
from weave_rl.planner.colocated import colocated_options
from weave_rl.planner.columns import Column, FreeNodes, Incumbent, group_timetable, materialize, template_column
from weave_rl.planner.halves import decomposed_plan, half, phases_apart
from weave_rl.planner.lns import improve
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import (Candidate, CandidateBuilder, EnumerationBudget, NoPlanInTime, _admissible,
                             colocated_costs, group_plan, packing_half_bounds, packing_lower_bound, work_lower_bound)
from weave_rl.planner.pricing import PricingPool, price_exact
from weave_rl.planner.pairlp import JointLP, applies as pair_applies, by_whole_nodes
from weave_rl.planner.regroup import eligible, regroup
from weave_rl.planner.plan import DEFAULT_ELASTIC, GroupPlan, Plan, Rejection, SolverInfo
from weave_rl.planner.reasons import not_placed_reason, with_placement_note

Progress = Callable[[str], None]
SOLVERS = ("auto", "cpsat", "pulp")
ENUMERATION_BUDGET = 5_000
NEAR_COLUMNS = 2_000  # columns of small positive reduced cost collected once the LP is optimal
NEAR_SHARE = 0.02  # their threshold: this share of the LP value per job, times the group size
NEAR_TIME_SHARE = 0.1  # of the time limit, the most their search takes
# Column generation stops once its bound is this close to the LP (relative): the last round of a
# tailing-off LP gains less than this and takes seconds the integer plan needs (100 RH jobs: from
# 0.008 % to 0 took 2.5 of 30 s). At 0.25 % it stopped 300 Mixed jobs before their LP settled, and
# the dive from those duals ended 1 % dearer.
CG_GAP = 0.0005
SMALL_MASTER = 3_000
MASTER_SHARE = 0.88  # the integer master ends by this share of the time limit; the timetables take the rest
LNS_SHARE = 0.75  # of a large master's time, the neighbourhood search's (planner/lns.py); CBC has the rest
# A master of at most this many columns is solved whole by CBC, all its time: on 100 RH jobs (5,800
# columns) 10 s of it reached 1.2 % above the LP, where the restricted master and the search stayed at 5 %.
WHOLE_MASTER = 8_000
DIVE_NOISE = 0.5  # dives after the first rank fractional columns by value times a factor in [1, 1.5)
# The dives' plans merged: CP-SAT over the union of their columns and the LP's support picks the
# best combination (100 RH jobs s3: 7 dives of $1,920.88 at best merged into $1,878.64, in 0.06 s).
MERGE_S = 1.0
RESTRICTED_MASTER = 2_000  # else the master first sees the columns of least reduced cost, this many
DECOMPOSE_SHARE = 0.12  # of the time limit, the most the plan by halves takes (planner/halves.py)
TRAIN_HALF_SHARE = 0.1  # of the time limit, the most the training half's LP takes then
PAIR_END = 0.3  # the LP by pairs (planner/pairlp.py) ends by this share of the time limit (in one process)
PAIR_TRIAL = 0.15  # ... when it has not settled by this share, column generation is skipped
REGROUP_END = 0.84  # its regrouping (planner/regroup.py) ends by this share of the time limit
REGROUP_TIMETABLE_S = 0.25  # the most a regrouped group's timetable may take (else the group is not formed)
STALL_AFTER, STALL_WINDOW = 0.25, 0.07  # of the time limit: from when, and over how long, column generation
STALL_DROP = 0.01  # ... that falls by less than this share, no pricing proven, stops (where a fallback applies)
PARALLEL_JOBS = 50  # jobs from which exact pricing runs in worker processes (one per thread)


@dataclass
class OptimalResult:
    plan: Plan
    columns: int = 0
    mode: str = "enumerate"  # enumerate | colgen
    lp_iterations: int = 0
    master_solves: int = 0
    timetable_failures: int = 0
    complete: bool = True
    stats: dict = field(default_factory=dict)


def plan_optimal(model: PlanningModel, *, max_group_size: int = 5, time_limit_s: float = 60.0, threads: int = 2,
                 progress: Progress | None = None, solver: str = "auto", start: Plan | None = None,
                 pinned: Sequence[GroupPlan] = (), extra: Mapping[str, float] | None = None,
                 enumeration_budget: int = ENUMERATION_BUDGET) -> OptimalResult:
    """Minimum-cost plan. ``pinned`` groups may be kept on their nodes at no extra charge; ``extra``
    charges a job (by name) whenever it lands anywhere else (``replan``'s migration cost)."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r} (solvers: {', '.join(SOLVERS)})")
    started = time.perf_counter()
    deadline = started + time_limit_s
    say = progress or (lambda _msg: None)
    topo = model.topology
    rejected, job_ids = _admissible(model)
    index = {name: i for i, name in enumerate(model.jobs.names)}
    charge = {index[n]: v for n, v in (extra or {}).items() if n in index}
    penalty = reject_penalty(topo)
    result = OptimalResult(plan=None)  # type: ignore[arg-type]

    columns: list[Column] = []
    seen: dict = {}  # column key -> index
    allowed = set(job_ids)

    def add(column: Column) -> bool:
        if column.key in seen or not set(column.jobs) <= allowed:
            return False
        seen[column.key] = len(columns)
        columns.append(column)
        return True

    # Templates: the heuristic's plan and the previous one are both feasible starting points. A
    # previous plan's groups and pinned groups met other profiles: only those whose timetable still
    # meets every SLO enter.
    timetables: dict[int, object] = {}
    verified: dict[int, tuple[list, list[str], object]] = {}  # chosen column -> its members, nodes, timetable

    def still_fits(column: Column) -> bool:
        members, _ = materialize(model, column, FreeNodes(topo))
        tt = group_timetable(model, members, time_limit_s=min(1.0, max(0.1, deadline - time.perf_counter())),
                             threads=threads)
        return tt.ok

    incumbents = []
    sources = _template_sources(model, max_group_size, start)
    heuristic = sources[0][1]  # the weave plan: the fallback when nothing is verified in time
    for trusted, source in sources:
        chosen = []
        for group in source.groups:
            column = template_column(model, group, extra=sum(charge.get(index[j.name], 0.0) for j in group.jobs))
            if column.key not in seen and (trusted or still_fits(column)):
                add(column)
            if column.key in seen:
                chosen.append(seen[column.key])
        placed = {j for i in chosen for j in columns[i].jobs}
        incumbents.append(Incumbent(chosen, [j for j in job_ids if j not in placed]))
    kept: list[int] = []
    for group in pinned:
        if all(j.name in index for j in group.jobs):
            column = template_column(model, group, pinned=True)
            if column.key in seen or not still_fits(column) or not add(column):
                continue
            if not set(column.jobs) & {j for i in kept for j in columns[i].jobs} \
                    and _conflict_free(columns, kept + [seen[column.key]]):
                kept.append(seen[column.key])  # keeping everything where it still fits: a starting point
    if kept:
        placed = {j for i in kept for j in columns[i].jobs}
        incumbents.append(Incumbent(kept, [j for j in job_ids if j not in placed]))
    say(f"{len(columns)} template groups")
    # The group model's single-job layouts that candidates do not express, in the LP from the start
    # so that column generation's bound covers them (no column of a solved LP has a negative reduced cost).
    for j, group in _single_layouts(model, job_ids):
        add(template_column(model, group, extra=charge.get(j, 0.0)))

    builder = CandidateBuilder(model, job_ids, max_group_size, budget=enumeration_budget,
                               deadline=started + 0.1 * time_limit_s)
    lagrangian, lp_state = None, None
    try:
        if builder.hopeless():
            raise EnumerationBudget("too many pairs to enumerate")
        for cand in builder.build():
            add(_candidate_column(cand, charge))
        result.mode = "enumerate" if builder.complete else "colgen"
        say(f"{len(columns)} columns (complete enumeration)" if builder.complete else "enumeration truncated")
    except EnumerationBudget:
        result.mode = "colgen"
        builder.complete = False
    hint = min(incumbents, key=lambda inc: _objective(columns, inc, penalty), default=None)
    banned: set[int] = set()
    large = result.mode == "colgen" or len(columns) > SMALL_MASTER
    for cand in _singletons(builder):  # so that rounding the LP can always place a job alone
        add(_candidate_column(cand, charge))
    # Where the plan by halves and its regrouping apply, column generation that will not settle
    # gives its time to them. Measured: on 300 RH jobs the LP falls 0.1-0.2 % a second and never
    # settles in 30 s; on Mixed-300 it falls about 1 % a second until it settles at 7-11 s.
    fallback = bool(job_ids) and not charge and phases_apart(builder) and eligible(builder)
    # Where a rollout node holds one job or two, the same LP by pairs (planner/pairlp.py) first: its
    # pricing is quicker. With threads to spare it goes on in a forked process while the plan is
    # regrouped; when it has not settled by PAIR_TRIAL, column generation would not either.
    joint, settled = None, False
    if fallback and result.mode == "colgen" and pair_applies(builder):
        joint = JointLP(builder, time.perf_counter() + TRAIN_HALF_SHARE * time_limit_s)
        background = threads > 1
        joint.start(started + (REGROUP_END if background else PAIR_END) * time_limit_s, background)
        settled = joint.settled(started + PAIR_TRIAL * time_limit_s)
        say(f"pair LP: bound ${joint.bound():,.2f}" + (" (optimal)" if settled else ", not settled")
            + (" (going on)" if joint.running and not settled else ""))
    # The LP: its bound, its rounding as a starting plan. A complete enumeration needs no pricing.
    try:
        if joint is None or settled:
            lagrangian, lp_state = _column_generation(
                model, builder, columns, add, job_ids, charge, penalty, result, deadline=started + 0.6 * time_limit_s,
                threads=threads, say=say, incumbent=_objective(columns, hint, penalty) if hint else None,
                price=result.mode == "colgen", dive_s=0.15 * time_limit_s, near_s=NEAR_TIME_SHARE * time_limit_s,
                dive_unproven=not phases_apart(builder),  # else the plan by halves starts the master
                stall=(started + STALL_AFTER * time_limit_s, STALL_WINDOW * time_limit_s) if fallback else None)
        else:
            say("column generation skipped: the LP by pairs did not settle")
    except LpTrouble as exc:  # no LP bound this time: the integer master still runs on the columns
        say(str(exc))
        result.stats["lp_trouble"] = str(exc)
    # Bounds besides column generation's: the halves' (planner/halves.py) when it proved none, and
    # the LP by pairs' (with the halves', by whole nodes: planner/pairlp.py).
    halves_bound = None
    kinds = None  # (training half's bound, rollout half's) behind halves_bound, when known
    bound_source = "the halves' (planner/halves.py)"
    if result.mode == "colgen" and lagrangian is None and job_ids and phases_apart(builder):
        # Column generation did not settle (300 RH jobs in 30 s): its dives were skipped, and the
        # plan built half by half (rollout classes, then training pools) is the better start.
        # Where a cluster hosts both kinds of phase the halves know nothing of it (300 Hetero
        # jobs: 45-70 % dearer than the rounded LP), so the unsettled LP is dived on instead.
        solved = (joint.rollout_packing, joint.rollout) if joint is not None else None
        # One thread fewer while the LP by pairs goes on in its process.
        workers = max(1, threads - 1) if joint is not None and joint.running else threads
        groups, rollout_bound = decomposed_plan(builder, time.perf_counter() + DECOMPOSE_SHARE * time_limit_s, workers,
                                                solved)
        if phases_apart(builder):
            # The training half's LP too, where it is quick (1-2 s on 300 RH jobs: each job's
            # loop bounds its pool's cap), else its packing bound.
            train_bound = joint.train.bound if joint is not None else \
                half(builder, "train").solve(time.perf_counter() + TRAIN_HALF_SHARE * time_limit_s).bound
            halves = packing_half_bounds(model, job_ids, max_group_size)
            train_bound, rollout_bound = max(halves["train"], train_bound), max(halves["rollout"], rollout_bound)
            halves_bound = train_bound + rollout_bound
            kinds = (train_bound, rollout_bound)
        if groups and not charge:  # windows of its groups re-cut exactly (planner/regroup.py)
            before = sum(g.cost for g in groups)
            def timetabled(cand: Candidate) -> bool:
                members, _ = materialize(model, _candidate_column(cand, charge), FreeNodes(topo))
                return group_timetable(model, members, time_limit_s=REGROUP_TIMETABLE_S, threads=1).ok

            groups = regroup(builder, groups, started + REGROUP_END * time_limit_s, workers, timetabled=timetabled)
            say(f"regrouped: ${before:,.2f} -> ${sum(g.cost for g in groups):,.2f}")
        if joint is not None and halves_bound is not None:
            joint.close()  # its last bound
            pairs = by_whole_nodes(builder, joint.pair.bound if joint.pair else 0.0, train_bound, rollout_bound)
            if pairs > halves_bound + 1e-6:
                halves_bound = pairs
                bound_source = "the Lagrangian bound of the LP by pairs (planner/pairlp.py) with the halves', by whole nodes"
        chosen = []
        for cand in groups:
            column = _candidate_column(cand, charge)
            add(column)
            chosen.append(seen[column.key])
        if chosen and _within_nodes(columns, chosen, topo):
            covered = {j for i in chosen for j in columns[i].jobs}
            halved = Incumbent(chosen, [j for j in job_ids if j not in covered])
            say(f"plan by halves: ${_objective(columns, halved, penalty):,.2f}, bound by halves "
                f"${halves_bound or 0.0:,.2f}")
            if hint is None or _objective(columns, halved, penalty) < _objective(columns, hint, penalty):
                hint = halved
    elif joint is not None:  # settled: its bound by whole nodes may round the LP's up
        halves_bound = joint.bound()
        kinds = (joint.train.bound, joint.rollout.bound)
    if joint is not None:
        joint.close()
    result.columns = len(columns)
    exclusive = _shared_nodes(columns)
    if solver == "auto":  # measured in bench/planner_scale.py: CBC's LP-based search suits large
        # masters with a tight LP; CP-SAT solves small complete enumerations exactly.
        solver = "pulp" if large else "cpsat"
    priced_out: set[int] = set()  # columns the master skips at first (see _price_out)
    whole = not large  # the master sees every column that may improve its hint (else a restricted set, then the search)
    if lp_state is not None:
        rounded = _round_lp(columns, lp_state, job_ids, topo)
        if lp_state.dive is not None and _conflict_free(columns, lp_state.dive):
            covered = {j for i in lp_state.dive for j in columns[i].jobs}
            dived = Incumbent(lp_state.dive, [j for j in job_ids if j not in covered])
            if _objective(columns, dived, penalty) < _objective(columns, rounded, penalty):
                rounded = dived
        say(f"rounded LP: ${_objective(columns, rounded, penalty):,.2f}")
        merged = _merge_dives(columns, lp_state, job_ids, topo, penalty, exclusive, threads)
        if merged is not None and _objective(columns, merged, penalty) < _objective(columns, rounded, penalty) - 1e-6:
            rounded = merged
            say(f"dives merged: ${_objective(columns, rounded, penalty):,.2f}")
        if hint is None or _objective(columns, rounded, penalty) < _objective(columns, hint, penalty):
            hint = rounded
        if large:  # small complete enumerations keep every column: their master is exact
            # An LP that has not settled guides CBC poorly: the neighbourhood search does better.
            whole = len(columns) <= WHOLE_MASTER and lagrangian is not None
            priced_out = _price_out(columns, lp_state, _objective(columns, hint, penalty), hint,
                                    keep_at_most=None if whole else RESTRICTED_MASTER)
            banned |= priced_out
    support: dict[int, list[int]] = {}  # job -> columns the LP used: the search's neighbourhoods follow them
    for i, v in enumerate(lp_state.x if lp_state is not None else ()):
        if v > 1e-6:
            for j in columns[i].jobs:
                support.setdefault(j, []).append(i)
    master = None
    early: Plan | None = None  # the best plan mended after a failed verification
    while job_ids:
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        # The LP bound is already known: the master need not prove much, it must leave time for
        # the timetables. A large master shares its time with the neighbourhood search.
        master_end = started + MASTER_SHARE * time_limit_s
        share = 0.0 if whole else LNS_SHARE
        master = solve_integer(columns, job_ids, topo, banned=banned, penalty=penalty,
                               time_limit_s=max(min(1.0, left / 3), (1 - share) * (master_end - time.perf_counter())),
                               threads=threads, solver=solver, hint=hint, exclusive=exclusive)
        result.master_solves += 1
        if master.objective is None and hint is not None:  # no solution in time: the best known plan
            master = IntegerResult("FEASIBLE", list(hint.columns), list(hint.rejected),
                                   _objective(columns, hint, penalty), None)
        if not master.chosen and len(master.rejected) < len(job_ids):
            master = None
            break
        say(f"master {result.master_solves}: ${master.objective:,.2f}/h ({master.status})")
        failed = _verify(model, columns, master.chosen, verified, banned, deadline, threads, result, timetables)
        if failed is None:  # out of time before every group had a timetable (repaired below)
            break
        if failed:
            # The verified groups with the failed groups' jobs admitted around them: kept in case
            # the master's next plans do no better in the time left.
            verified_groups = [group_plan(model, f"g{gi}", *verified[i]) for gi, i in enumerate(
                i for i in master.chosen if i in verified and i not in failed)]
            mended = _repair(model, verified_groups, [j for i in failed for j in columns[i].jobs] + master.rejected,
                             max_group_size)
            if early is None or _worse(early, mended):
                early = mended
            for i in failed:  # a set whose kept configurations all failed gets its next one
                cand = columns[i].candidate
                spare = builder.reserve.get(cand.jobs) if cand is not None else None
                if spare:
                    add(_candidate_column(spare.pop(0), charge))
            # The plan less the failed groups, their jobs rejected: still feasible, a safe next hint.
            kept_columns = [i for i in master.chosen if i not in banned]
            covered = {j for i in kept_columns for j in columns[i].jobs}
            hint = Incumbent(kept_columns, [j for j in job_ids if j not in covered])
            continue
        at_bound = lagrangian is not None and master.objective <= lagrangian * (1 + 1e-6) + 1e-6
        if not whole and not at_bound and master_end - time.perf_counter() > 0.5:
            master = _search_neighbourhoods(model, columns, job_ids, master, banned - priced_out, penalty, master_end,
                                            exclusive, support, threads, timetables, verified, result, say)
        break
    jobs = model.jobs.jobs
    chosen = master.chosen if master else []
    order = sorted(chosen, key=lambda i: (not columns[i].pinned, columns[i].jobs))
    groups = [group_plan(model, f"g{gi}", *verified[i]) for gi, i in enumerate(i for i in order if i in verified)]
    lost = master.rejected if master else []
    repaired = None
    why_repaired = "time ran out verifying the master's plan: its verified groups, the other jobs admitted around them"
    if job_ids and (master is None or any(i not in verified for i in master.chosen)):
        # Out of time before every chosen group had a timetable: keep the verified groups and admit
        # the other jobs around them; use that when it is no worse than the weave plan.
        repaired = _repair(model, groups, [j for i in chosen if i not in verified for j in columns[i].jobs] + lost,
                           max_group_size) if master is not None else None
        if repaired is None or _worse(repaired, heuristic):
            bound = None
            if lagrangian is not None and not (heuristic.rejected or charge):  # same jobs placed: comparable
                bound = max(lagrangian, _simple_bound(model, job_ids, max_group_size))
            raise NoPlanInTime(f"no verified plan within {time_limit_s:g} s", heuristic, bound)
        groups = repaired.groups
        names = {r.name for r in repaired.rejected}
        lost = [j for j in job_ids if jobs[j].name in names]
        say(f"repaired: {len(groups)} groups, ${repaired.cost_usd_per_hour:,.2f}/h")
    if early is not None and (len(early.rejected), early.cost_usd_per_hour) < \
            (len(lost), sum(g.usd_per_hour or 0.0 for g in groups)):
        repaired, why_repaired = early, "some groups of the master's plan have no timetable: the verified " \
            "groups, their jobs admitted around them"
        groups = early.groups
        names = {r.name for r in early.rejected}
        lost = [j for j in job_ids if jobs[j].name in names]
        say(f"mended after the first failed timetables: {len(groups)} groups, ${early.cost_usd_per_hour:,.2f}/h")
    wall = time.perf_counter() - started
    cost = round(sum(g.usd_per_hour or 0.0 for g in groups), 6)
    if repaired is not None:
        rejected = rejected + list(repaired.rejected)
    else:
        rejected = rejected + [Rejection(name=jobs[j].name, reason=not_placed_reason(model, jobs[j], groups,
                                                                                  max_group_size)) for j in lost]
    # A restricted master's own bound holds for its columns only.
    master_bound = master.bound if master is not None and not priced_out else None
    if halves_bound is not None:
        halves_bound = _allow_colocation(model, builder, halves_bound, kinds, joint)
        say(f"bound by halves with colocated jobs: ${halves_bound or 0.0:,.2f}")
    lb, note = _bound(model, builder, result, master is not None, master_bound, lagrangian, job_ids, lost, penalty,
                      cost, charge, halves_bound, bound_source)
    gap = (cost - lb) / cost if cost > 0 else 0.0
    status = master.status if master else "OPTIMAL"
    if repaired is not None:
        status = "FEASIBLE"
        note = (note + "; " if note else "") + why_repaired
    if status == "OPTIMAL" and gap > 1e-6:
        status = "FEASIBLE"
    note = with_placement_note(note, len(model.jobs.jobs) - len(rejected), len(model.jobs.jobs))
    info = SolverInfo(name=solver, status=status, wall_s=round(wall, 3), gap=round(gap, 6), objective=cost,
                      bound=round(lb, 6), note=note)
    result.plan = Plan(policy="optimal", objective="cost", quantile=model.quantile, topology=topo.name,
                       cost_usd_per_hour=cost, lower_bound_usd_per_hour=round(lb, 6), solver=info, groups=groups,
                       rejected=rejected, elastic=dict(DEFAULT_ELASTIC))
    return result


def _repair(model: PlanningModel, groups: list[GroupPlan], jobs: list[int], max_group_size: int) -> Plan:
    """``groups`` kept as they are, each of ``jobs`` admitted around them (planner.admission)."""
    from weave_rl.planner.admission import AdmissionPlanner

    partial = Plan.model_construct(version=1, policy="optimal", objective="cost", quantile=model.quantile,
                                   topology=model.topology.name, solver=SolverInfo(name="repair", status="FEASIBLE"),
                                   cost_usd_per_hour=round(sum(g.usd_per_hour or 0.0 for g in groups), 6),
                                   lower_bound_usd_per_hour=None, groups=groups, rejected=[],
                                   elastic=dict(DEFAULT_ELASTIC))
    online = AdmissionPlanner(model.topology, model.jobs, partial, quantile=model.quantile,
                           max_group_size=max_group_size, link_budget=None)
    specs = model.jobs.jobs
    for j in sorted(jobs, key=lambda j: -specs[j].weight_bytes):  # big jobs first, while nodes are free
        online.admit(specs[j])
    return online.plan


def _worse(plan: Plan, other: Plan) -> bool:
    """More jobs rejected, or as many and dearer."""
    return (len(plan.rejected), plan.cost_usd_per_hour) > (len(other.rejected), other.cost_usd_per_hour)


def _template_sources(model: PlanningModel, max_group_size: int, start: Plan | None) -> list[tuple[bool, Plan]]:
    """(trusted, plan): the weave heuristic's plan, made for this model, and the previous plan, whose
    groups are checked against the current profiles before use."""
    from weave_rl.planner.baselines import plan_weave

    sources = [(True, plan_weave(model, max_group_size=max_group_size))]
    if start is not None:
        known = set(model.jobs.names)
        groups = [g for g in start.groups if all(j.name in known for j in g.jobs)]
        sources.append((False, start.model_copy(update={"groups": groups})))
    return sources


def _shared_nodes(columns: list[Column]) -> list[list[int]]:
    """Pinned columns that hold the same physical node: at most one of each set may be chosen."""
    holders: dict[str, list[int]] = {}
    for i, col in enumerate(columns):
        if col.pinned:
            for n in col.template.nodes:
                holders.setdefault(n, []).append(i)
    return [sorted(set(h)) for h in {tuple(h) for h in holders.values() if len(h) > 1}]


def _within_nodes(columns: list[Column], chosen: list[int], topo) -> bool:
    """The chosen columns fit every cluster's node count (the plan by halves does not check it)."""
    used: dict[str, int] = {}
    for i in chosen:
        for c, n in columns[i].nodes:
            used[c] = used.get(c, 0) + n
    return all(n <= topo.clusters[c].nodes for c, n in used.items())


def _conflict_free(columns: list[Column], chosen: list[int]) -> bool:
    nodes = [n for i in chosen if columns[i].pinned for n in columns[i].template.nodes]
    return len(nodes) == len(set(nodes))


def _single_layouts(model: PlanningModel, job_ids: list[int]) -> list[tuple[int, GroupPlan]]:
    """Each job alone as the ``colocate`` policy lays it out (rollout and train taking turns on the
    same GPUs, at every GPU count and type that meets its SLO: planner/colocated.py), and as the
    ``solo`` policy does where its rollout and train share a node (one-cluster topologies; elsewhere
    a candidate is the same group). So the master places every job either baseline places alone."""
    from weave_rl.planner.baselines import plan_solo
    from weave_rl.profiles.jobs import JobSet

    out = []
    for j in job_ids:
        job = model.jobs.jobs[j]
        out += [(j, c.group) for c in colocated_options(model, job)]
        if _may_share_a_cluster(model, job):
            solo = plan_solo(PlanningModel(model.topology, JobSet(jobs=(job,)), model.quantile)).groups
            if solo and _phases_share_a_node(solo[0]):
                out.append((j, solo[0]))
    return out


def _may_share_a_cluster(model: PlanningModel, job) -> bool:
    types = {kind: set(job.phase(kind).gpu_types) for kind in ("rollout", "train")}
    return any(c.gpu_type in types["rollout"] and c.gpu_type in types["train"] for c in model.topology.clusters.values())


def _phases_share_a_node(group: GroupPlan) -> bool:
    job = group.jobs[0]
    nodes = {kind: {g.rpartition(":")[0] for g in job.phase(kind).gpus} for kind in ("rollout", "train")}
    return bool(nodes["rollout"] & nodes["train"])


def _allow_colocation(model: PlanningModel, builder: CandidateBuilder, bound: float,
                      kinds: tuple[float, float] | None = None, joint: JointLP | None = None) -> float | None:
    """A bound of plans without colocated jobs (the halves', the LP by pairs'), made one of every plan.

    Plans colocating no job keep ``bound``. A plan colocating ``k >= 1`` jobs ``S`` (at ``c_j`` each,
    on nodes of their own) is a plan of the other jobs plus those groups. Those bounds relax away
    node counts, so a plan of the other jobs plus each job of ``S`` in its cheapest candidate alone
    (``u_j``) is one of theirs: the plan costs at least ``bound + sum_S (c_j - u_j)``. Sharper where
    an LP's bound comes with its duals ``pi`` (the LP by pairs', or the halves' when both are
    optimal): restricted to the other jobs they still bound their LP, so the plan costs at least
    ``LP bound + sum_S (c_j - pi_j)``; rounded up to whole nodes as planner/pairlp.py does, with the
    rollout half's bound less the ``k`` largest rollout options alone and the training half's less
    what colocation may save there (colocated nodes are training nodes). Each sum over ``S`` is at
    least that of the ``k`` least terms. The result is the least of ``bound`` and, over ``k``, of
    the best of these. None when a job with a colocated group has no candidate alone."""
    colocated = colocated_costs(model, builder.job_ids)
    if not colocated:
        return bound
    alone = {cand.jobs[0]: cand.cost for cand in _singletons(builder)}
    if any(j not in alone for j in colocated):
        return None
    k_max = len(colocated)
    by_k = _prefix_least([c - alone[j] for j, c in colocated.items()], bound)  # per k = 1.. the crude bound
    certified = [] if joint is None else [(joint.pair.bound, joint.pair.duals) if joint.pair else (0.0, None),
                                          (sum(joint.center.values()), joint.center) if joint.center else (0.0, None)]

    def cheapest(options, j):
        return min(builder.price[o.cluster] * o.nodes for o in options[j])

    for value, duals in certified:
        if duals is None:
            continue
        lp = _prefix_least([c - duals[j] for j, c in colocated.items()], value)
        if kinds is not None:
            train = kinds[0] + sum(min(0.0, c - cheapest(builder.train_opts, j)) for j, c in colocated.items())
            rollout = _prefix_least([-cheapest(builder.rollout_opts, j) for j in colocated], kinds[1])
            lp = [by_whole_nodes(builder, lp[k], train, max(0.0, rollout[k])) for k in range(k_max)]
        by_k = [max(a, b) for a, b in zip(by_k, lp)]
    return min(bound, min(by_k))


def _prefix_least(values: list[float], base: float) -> list[float]:
    """``base`` plus the sum of the ``k`` least ``values``, for k = 1 .. len(values)."""
    out, total = [], base
    for v in sorted(values):
        total += v
        out.append(total)
    return out


def _singletons(builder: CandidateBuilder) -> list:
    out = []
    for j in builder.job_ids:
        pairs = [(t, o) for t in builder.train_opts[j] for o in builder.rollout_opts[j]
                 if builder.loop_s(j, t, o) <= builder.cap[j] + 1e-9]
        if pairs:
            t, o = min(pairs, key=lambda p: builder.price[p[0].cluster] * p[0].nodes
                       + builder.price[p[1].cluster] * p[1].nodes)
            out.append(make_candidate(builder, [j], t, [o], [[0]]))
    return out


def _candidate_column(cand, charge: Mapping[int, float]) -> Column:
    return Column(cand.jobs, cand.nodes, cand.cost, candidate=cand,
                  extra=round(sum(charge.get(j, 0.0) for j in cand.jobs), 6))


def _objective(columns: list[Column], inc: Incumbent, penalty: float) -> float:
    return sum(columns[i].objective for i in inc.columns) + penalty * len(inc.rejected)


def _column_generation(model, builder, columns, add, job_ids, charge, penalty, result, *, deadline, threads, say,
                       incumbent: float | None = None, price: bool = True, dive_s: float = 0.0, near_s: float = 0.0,
                       dive_unproven: bool = True, stall: tuple[float, float] | None = None):
    """Grow the columns by pricing until the LP is optimal, the bound meets it, or time runs out.
    Returns the best Lagrangian bound (None when no pricing was proven). Without ``dive_unproven``
    an LP whose pricing never completed is not dived on (the caller has a better start then). With
    ``stall = (after, window_s)``: from ``after`` (a time.perf_counter() value) on, an LP that fell
    by less than STALL_DROP in the last ``window_s`` seconds, no pricing proven yet, ends column
    generation: it will not settle in the time (the caller builds its plan otherwise)."""
    lp = LpMaster(job_ids, model.topology, penalty)
    for column in columns:
        lp.add(column)
    k_groups = max_groups(model.topology, len(job_ids), incumbent)
    best = -math.inf
    rotation: dict = {}
    value = None
    greedy = True
    history: list[tuple[float, float]] = []  # (time, LP value) per round
    near_duals = None  # the duals at which column generation stopped converged
    # Exact pricing is pure Python: with threads to spare, worker processes share the leaders.
    pool = PricingPool(builder, threads) if price and threads > 1 and len(job_ids) >= PARALLEL_JOBS else None
    try:
        while time.perf_counter() < deadline:
            try:
                value, pi, mu = lp.solve()
            except LpTrouble as exc:
                if value is None:
                    raise
                say(f"{exc}: column generation stops at the last LP")
                break
            result.lp_iterations += 1
            if not price:
                best = value
                break
            fresh = []
            if greedy:
                fresh = [c for c in (_candidate_column(cand, charge)
                                     for cand in price_greedy(builder, pi, mu, extra=charge)) if add(c)]
                greedy = len(fresh) >= 10  # once the heuristic dries up, the exact search takes over
            how = "greedy"
            if not fresh:  # search exactly, stopping early while columns abound
                pr = price_exact(builder, pi, mu, extra=charge, deadline=deadline, stop_after=300, rotation=rotation,
                                 pool=pool)
                if pr.proven:
                    best = max(best, value + max(k_groups * pr.rc_lower_bound, pr.rc_sum_bound or -math.inf))
                fresh = [c for c in (_candidate_column(cand, charge) for cand in pr.columns) if add(c)]
                how = "exact" + (", proven" if pr.proven else "")
                if not fresh and pr.proven:
                    best = max(best, value)
                    say(f"column generation {result.lp_iterations}: LP ${value:,.2f} optimal")
                    near_duals = (value, pi, mu)
                    break
            for column in fresh:
                lp.add(column)
            say(f"column generation {result.lp_iterations}: LP ${value:,.2f}, bound ${best:,.2f}, "
                f"+{len(fresh)} columns ({how})")
            now = time.perf_counter()
            history.append((now, value))
            if stall is not None and best == -math.inf and now >= stall[0]:
                earlier = [v for t, v in history if t <= now - stall[1]]
                if earlier and value > earlier[-1] * (1 - STALL_DROP):
                    say(f"column generation stops: its LP fell by under {STALL_DROP:.0%} in {stall[1]:.1f} s, "
                        f"no pricing proven")
                    break
            if value - best <= CG_GAP * max(1.0, abs(value)):
                near_duals = (value, pi, mu)
                break
        if near_duals is not None and time.perf_counter() < deadline:
            # Integer plans need columns the LP did not: collect those of small reduced cost.
            value, pi, mu = near_duals
            near = price_exact(builder, pi, mu, extra=charge, max_columns=NEAR_COLUMNS, pool=pool,
                               deadline=min(deadline, time.perf_counter() + near_s),
                               threshold=NEAR_SHARE * value / max(1, len(job_ids)) * builder.k)
            near_columns = [c for c in (_candidate_column(cand, charge) for cand in near.columns) if add(c)]
            for column in near_columns:
                lp.add(column)
            say(f"columns near the LP optimum: +{len(near_columns)}")
    finally:
        if pool is not None:
            pool.close()
    result.stats["lp_value"] = value
    state = None
    if value is not None:
        try:
            value, pi, mu = lp.solve()  # the last columns added too
        except LpTrouble:  # the LP of the last round (its columns, its duals) stands
            return (best if best > -math.inf else None), LpState(value, pi, mu, lp.last_x)
        state = LpState(value, pi, mu, lp.values())
        # Diving on the whole LP (warm re-solves) finds integer plans close to the LP optimum.
        # Fixing a few disjoint columns per round (one per 25 jobs) keeps large LPs within the time.
        def dive_price(pi, mu, taken):
            pi = {j: (-1e9 if j in taken else v) for j, v in pi.items()}
            return [c for c in (_candidate_column(cand, charge) for cand in price_greedy(builder, pi, mu, extra=charge))
                    if add(c)]
        # Then dive again from the same LP with the ranking perturbed (the columns priced so far
        # stay); every plan is kept, the master merges them. A master solved whole (at most
        # WHOLE_MASTER columns) leans on these plans for all the dive's time; a larger one for a
        # third of it, as its neighbourhood search improves plans faster than more dives.
        end, per = time.perf_counter() + dive_s, max(1 + len(lp.columns) // 8000, len(job_ids) // 60)
        best_cost, attempt = math.inf, 0
        if best == -math.inf and not dive_unproven:
            say("LP dive: skipped (the LP has not settled)")
            return None, state
        while True:
            began = time.perf_counter()
            chosen = lp.dive(end, per=per, price=dive_price if price else None,
                             noise=0.0 if attempt == 0 else DIVE_NOISE, seed=attempt)
            if chosen is None:
                break
            covered = {j for i in chosen for j in columns[i].jobs}
            cost = _objective(columns, Incumbent(chosen, [j for j in job_ids if j not in covered]), penalty)
            state.dives.append(chosen)
            if cost < best_cost - 1e-6:
                state.dive, best_cost = chosen, cost
            if attempt == 0 and len(lp.columns) > WHOLE_MASTER:
                end = min(end, time.perf_counter() + dive_s / 3)
            attempt += 1
            lp.unfix()
            if end - time.perf_counter() < 1.5 * (time.perf_counter() - began):
                break
        if state.dive is None:  # out of time: round the dive's last LP (its fixings first) instead
            state.x = lp.last_x[:len(columns)]
        say(f"LP dive: {'out of time' if state.dive is None else f'{attempt} dive(s), best ${best_cost:,.2f}'}")
    return (best if best > -math.inf else None), state


@dataclass
class LpState:
    value: float
    pi: dict
    mu: dict
    x: list[float]
    dive: list[int] | None = None  # columns of an integral solution found by diving
    dives: list[list[int]] = field(default_factory=list)  # every dive's plan


def _reduced_cost(column: Column, state: LpState) -> float:
    return (column.objective - sum(state.pi[j] for j in column.jobs)
            - sum(state.mu.get(c, 0.0) * n for c, n in column.nodes))


def _round_lp(columns: list[Column], state: LpState, job_ids: list[int], topo) -> Incumbent:
    """A plan from the LP solution: its columns by decreasing value while they fit, then columns of
    jobs left over only, cheapest per job first (a dive cut short leaves many: alone, each would
    pay a whole training node), then each job still left in its cheapest single-job column that
    still fits (else rejected)."""
    left = {c: spec.nodes for c, spec in topo.clusters.items()}
    covered: set[int] = set()
    chosen: list[int] = []

    def take(i: int) -> bool:
        col = columns[i]
        if covered.intersection(col.jobs) or any(left[c] < n for c, n in col.nodes) \
                or not _conflict_free(columns, chosen + [i]):
            return False
        chosen.append(i)
        covered.update(col.jobs)
        for c, n in col.nodes:
            left[c] -= n
        return True

    for i in sorted(range(len(state.x)), key=lambda i: -state.x[i]):
        if state.x[i] < 1e-6:
            break
        take(i)
    for i in sorted((i for i, col in enumerate(columns) if len(col.jobs) > 1 and not col.pinned),
                    key=lambda i: columns[i].objective / len(columns[i].jobs)):
        if len(covered) == len(job_ids):
            break
        take(i)
    singles: dict[int, list[int]] = {}
    for i, col in enumerate(columns):
        if len(col.jobs) == 1 and not col.pinned:
            singles.setdefault(col.jobs[0], []).append(i)
    for j in job_ids:
        if j not in covered:
            for i in sorted(singles.get(j, []), key=lambda i: columns[i].objective):
                if take(i):
                    break
    return Incumbent(chosen, [j for j in job_ids if j not in covered])


def _merge_dives(columns: list[Column], state: "LpState", job_ids: list[int], topo, penalty: float,
                 exclusive: list[list[int]], threads: int) -> Incumbent | None:
    """The cheapest plan over the columns of every dive and the LP's support (CP-SAT, within
    ``MERGE_S``): dives fix different columns first, and one dive's groups may complete another's.
    None with fewer than two dives or when CP-SAT found nothing in time."""
    if len(state.dives) < 2 or len(columns) > WHOLE_MASTER:  # large masters: the neighbourhood search instead
        return None
    pool = {i for dive in state.dives for i in dive} | {i for i, v in enumerate(state.x) if v > 1e-6}
    plans = []
    for dive in state.dives:
        covered = {j for i in dive for j in columns[i].jobs}
        plans.append(Incumbent(dive, [j for j in job_ids if j not in covered]))
    merged = solve_integer(columns, job_ids, topo, banned=set(range(len(columns))) - pool, penalty=penalty,
                           time_limit_s=MERGE_S, threads=threads, solver="cpsat", exclusive=exclusive,
                           hint=min(plans, key=lambda plan: _objective(columns, plan, penalty)))
    if merged.objective is None:
        return None
    return Incumbent(merged.chosen, merged.rejected)


def _price_out(columns: list[Column], state: LpState, upper: float, hint: Incumbent,
               keep_at_most: int | None = RESTRICTED_MASTER) -> set[int]:
    """Columns the integer master may ignore: a plan better than ``upper`` uses only columns of reduced
    cost at most ``upper - LP - gain`` (exact); beyond that, only the ``keep_at_most`` of least reduced
    cost stay (a heuristic that keeps the master fast; the bound does not depend on it).

    ``gain``: a plan costs the LP value plus its columns' reduced costs, so a column is ruled out by
    its own reduced cost only if no other column has a negative one. The dives price columns after
    the LP was solved, which may have; each job lies in one column of a plan, so together they lower
    a plan's cost by at most the sum over jobs of the least per-member share of a negative reduced cost."""
    rc = {i: _reduced_cost(col, state) for i, col in enumerate(columns)}
    share: dict[int, float] = {}
    for i, r in rc.items():
        if r < 0:
            for j in columns[i].jobs:
                share[j] = min(share.get(j, 0.0), r / len(columns[i].jobs))
    slack = upper - state.value - sum(share.values())
    keep = sorted((i for i, r in rc.items() if r <= slack + 1e-6), key=lambda i: rc[i])
    singles = {i for i, col in enumerate(columns) if len(col.jobs) == 1}
    keep = set(keep[:keep_at_most] if keep_at_most is not None else keep) | set(hint.columns) | singles
    return {i for i in rc if i not in keep}


def _search_neighbourhoods(model, columns, job_ids, master: IntegerResult, banned: set[int], penalty, deadline,
                           exclusive, support, threads, timetables, verified, result, say) -> IntegerResult:
    """The master's verified plan improved over every column not ``banned`` (planner/lns.py), each
    improvement only with a timetable for every new group; the plan returned is laid out in
    ``verified``. With threads to spare, one search per thread in forked processes (the search is
    pure Python but for small CP-SAT models), in epochs that all start from the best plan so far."""
    start = Incumbent(list(master.chosen), list(master.rejected), master.objective)
    setup = (model, columns, job_ids, penalty, exclusive, support)
    if threads > 1:
        better = _parallel_search(setup, start, banned, timetables, deadline, threads, result.master_solves)
    else:
        better = _search_part(setup, start, banned, timetables, deadline, result.master_solves, threads)[0]
    if better.objective >= master.objective - 1e-6:
        return master
    say(f"neighbourhood search: ${better.objective:,.2f}/h")
    improved = IntegerResult("FEASIBLE", better.columns, better.rejected, better.objective, None)
    # Every group has its timetable already (kept, or accepted above): laying it out takes no search.
    if _verify(model, columns, improved.chosen, verified, set(), math.inf, threads, result, timetables) == []:
        return improved
    _verify(model, columns, master.chosen, verified, set(), math.inf, threads, result, timetables)
    return master


def _search_part(setup, start: Incumbent, banned: set[int], timetables: dict, deadline: float, seed: int,
                 threads: int) -> tuple[Incumbent, dict]:
    """One neighbourhood search; returns its plan and the timetables it computed (``timetables``
    and ``banned`` gain them too)."""
    model, columns, job_ids, penalty, exclusive, support = setup
    known = set(timetables)

    def timetabled(new: list[int]) -> bool:
        ok = _timetabled(model, columns, new, timetables, deadline, threads)
        banned.update(i for i in new if i in timetables and not timetables[i].ok)
        return ok

    better = improve(columns, job_ids, model.topology, start, banned=banned, penalty=penalty, deadline=deadline,
                     exclusive=exclusive, support=support, seed=seed, accept=timetabled)
    return better, {i: tt for i, tt in timetables.items() if i not in known}


_SEARCH: dict = {}  # what the forked search processes inherit


def _search_worker(args):
    start, seed, deadline = args
    setup, banned, timetables = _SEARCH["setup"], _SEARCH["banned"], _SEARCH["timetables"]
    return _search_part(setup, start, set(banned), dict(timetables), deadline, seed, 1)


LNS_EPOCH_S = 2.0  # the parallel searches meet this often and go on from the best plan


def _parallel_search(setup, start: Incumbent, banned: set[int], timetables: dict, deadline: float, workers: int,
                     seed: int) -> Incumbent:
    """``workers`` searches of different seeds per epoch, each from the best plan of the last epoch.
    Fresh processes every epoch inherit the columns banned and timetables found so far."""
    import multiprocessing

    best, epoch = start, 0
    while deadline - time.perf_counter() > 0.3:
        end = min(deadline, time.perf_counter() + LNS_EPOCH_S)
        if deadline - end < 1.0:  # no short last epoch: this one runs to the deadline
            end = deadline
        _SEARCH.update(setup=setup, banned=banned, timetables=timetables)
        pool = multiprocessing.get_context("fork").Pool(workers)
        try:
            answers = pool.map(_search_worker, [(best, 1000 * seed + workers * epoch + w, end) for w in range(workers)])
        finally:
            pool.terminate()
            _SEARCH.clear()
        for plan, found in answers:
            timetables.update(found)
            banned.update(i for i, tt in found.items() if not tt.ok)
            if plan.objective < best.objective - 1e-6:
                best = plan
        epoch += 1
    return best


def _timetabled(model, columns, new: list[int], timetables: dict, deadline: float, threads: int) -> bool:
    """Whether each of the ``new`` columns has a timetable (computed now when not known, within
    0.3 s each; a column still unknown after that counts as without)."""
    for i in new:
        if i not in timetables:
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            members, _ = materialize(model, columns[i], FreeNodes(model.topology))
            timetables[i] = group_timetable(model, members, time_limit_s=min(0.3, left), threads=threads)
        if not timetables[i].ok:
            return False
    return True


def _verify(model, columns, chosen, verified, banned, deadline, threads, result, timetables) -> list[int] | None:
    """Lay out and timetable every chosen column; ban those without a timetable. Returns those that
    failed, or None when time ran out first. A column's timetable does not depend on which
    nodes of its clusters it gets, so ``timetables`` keeps it across master solves."""
    reserved = {n for i in chosen if columns[i].pinned for n in columns[i].template.nodes}
    free = FreeNodes(model.topology, reserved)
    verified.clear()  # nodes laid out for an earlier master's plan may clash with this one's
    failed: list[int] = []
    order = sorted(chosen, key=lambda i: not columns[i].pinned)
    laid_out = {i: materialize(model, columns[i], free) for i in order}
    for i in order:  # the round robins first: constant time each
        if i not in timetables:
            tt = group_timetable(model, laid_out[i][0], time_limit_s=0.0, threads=threads)
            if tt.ok:
                timetables[i] = tt
    # Then the exact timetables, each its share of the time left, so that groups CP-SAT cannot
    # decide do not take the others' time (300 Hetero jobs: three took 2 s each, the groups after
    # them went unverified, and the repaired plan was 9 % dearer).
    hard = [i for i in order if i not in timetables]
    for n, i in enumerate(hard):
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        tt = group_timetable(model, laid_out[i][0], time_limit_s=min(2.0, left / (len(hard) - n)), threads=threads)
        if tt.status == "UNKNOWN" and deadline - time.perf_counter() <= 0:
            return None
        timetables[i] = tt
    for i in order:
        members, nodes = laid_out[i]
        tt = timetables[i]
        if tt.ok:
            verified[i] = (members, nodes, tt)
        else:
            banned.add(i)
            verified.pop(i, None)
            result.timetable_failures += 1
            failed.append(i)
    return failed


def _simple_bound(model: PlanningModel, job_ids: list[int], max_group_size: int) -> float:
    """The bounds that need no LP: work, and nodes as bins (planner/optimal.py)."""
    return max(work_lower_bound(model, job_ids), packing_lower_bound(model, job_ids, max_group_size))


def _bound(model, builder, result, planned, master_bound, lagrangian, job_ids, lost, penalty, cost, charge,
           halves_bound=None, bound_source="the halves' (planner/halves.py)"):
    note = None
    lb = 0.0
    if result.mode == "enumerate" and master_bound is not None:
        lb = max(master_bound, lagrangian if lagrangian is not None else -math.inf)
    elif lagrangian is not None:
        lb = lagrangian
    else:
        note = "column generation proved no bound in time: the bound is the work or packing bound"
    lb -= penalty * len(lost)
    if charge:  # the master's objective includes migration charges; the plan's cost does not
        lb -= sum(charge.values())
    if not lost:
        lb = max(lb, _simple_bound(model, job_ids, builder.k), halves_bound or 0.0)
        if note and halves_bound and lb == halves_bound:
            note = f"column generation proved no bound in time: the bound is {bound_source}"
    lb = min(max(lb, 0.0), cost)
    if not planned and job_ids:
        note = "no plan verified"
    return lb, note
