"""The ``optimal`` policy, cost objective: set partitioning over co-execution groups.

1. Columns: the weave heuristic's groups and a previous plan's (``start``) as templates, so the
   result is never worse than either; pinned groups (``replan`` keeps them); every job alone as the
   ``colocate`` and ``solo`` policies lay it out, so no baseline places a job this cannot; every set
   of jobs that may time-share one pool (planner/colocated.py); and candidate groups
   (planner/optimal.py): all of them when the enumeration fits its budget, else those that column
   generation prices (planner/colgen.py, planner/pricing.py).
2. Integer master (CP-SAT, or CBC through PuLP): each job in one group or rejected, node counts per
   cluster within the topology; it places as many jobs as it can, then minimises $/h plus any
   migration charge, from the best known plan as hint. After column generation CBC solves a master
   of at most 8,000 columns whole; a large neighbourhood search (planner/lns.py) then improves the
   plan over every column. "auto": CBC there, else CP-SAT.
3. Every chosen group gets a timetable (planner/columns.py: the round robin when it meets every
   SLO, else the exact one); a group without one is banned and the master re-solved.

Lower bound, always valid for the model (reported as ``lower_bound_usd_per_hour`` and the gap):
- complete enumeration: the better of the master's own bound and the LP relaxation's;
- otherwise column generation's Lagrangian bound at its last complete pricing (LP value plus the
  per-leader sum of least reduced costs; the LP optimum once no column improves). Column generation
  stops within ``CG_GAP`` of it, and where its time ends first it goes on in a forked process while
  the plan is built (``_bound_later``);
- never below the work bound or the packing bound (planner/optimal.py).
With rejections the bound is on plans that place as many jobs (the plan's note says so). The
colocated groups and shared pools are in the LP from the start, so its bound covers them.

Where jobs train at several GPU counts on a cluster (Hetero), column generation prices pools of one
count first (their LP settles in seconds), then every pool (planner/pricing.py ``mixed``): only that
pricing's bound is the model's. The candidate rules are loose for groups of mixed counts, so those
groups (and the LP's groups without a round robin) are decided exactly once the LP is solved, least
reduced cost first, for the DECIDE share of the time: those without a timetable stay in the LP (the
bound needs them) but are closed to its dives and banned from the master; those not reached are
decided by the dives that would fix them.

Integer plans: dives on the LP (fixing a few columns per round, pricing greedily the jobs left; then
ranked with seeded noise), the cheapest the master's hint; the neighbourhood search takes the columns
the background sends and prices its own (``_price_area``). Time: one budget (planner/budget.py). No
plan verified in time, or one the checker (planner/check.py) rejects: ``NoPlanInTime`` (the API then
falls back to the weave policy).
"""

from __future__ import annotations

import math
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from weave_rl.planner import kernel
from weave_rl.planner.budget import (COLGEN_END, DECIDE, DIVE, ENUMERATION_END, MASTER_END, NEAR,
                                     TEMPLATES_END, TimeBudget)
from weave_rl.planner.check import check_plan, format_violations
from weave_rl.planner.colgen import (IntegerResult, LpMaster, LpTrouble, max_groups, price_greedy,
                            reject_penalty, solve_integer)
from weave_rl.planner.colocated import SharedPools, colocated_options, shared_pools
from weave_rl.planner.columns import (Column, Incumbent, column_timetable, exact_timetable, group_timetable,
                                      materialize, template_column)
from weave_rl.planner.lns import search
from weave_rl.planner.live import NodeAllocator
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.rules import fits_cap
from weave_rl.planner.optimal import (Candidate, CandidateBuilder, EnumerationBudget, NoPlanInTime, _admissible,
                                      group_plan, make_candidate, packing_lower_bound, work_lower_bound)
from weave_rl.planner.pricing import PricingPool, price_exact
from weave_rl.planner.plan import DEFAULT_ELASTIC, GroupPlan, Plan, Rejection, SolverInfo
from weave_rl.planner.reasons import not_placed_reason, with_placement_note
from weave_rl.profiles.jobs import JobSet

Progress = Callable[[str], None]
SOLVERS = ("auto", "cpsat", "pulp")
ENUMERATION_BUDGET = 5_000
NEAR_COLUMNS = 2_000  # columns of small positive reduced cost collected once the LP is optimal
# Groups kept per leader and exact pricing round, so a round's 300 columns come from 60 leaders or more
# (300 Hetero jobs: at 10 the LP settled later, s3's bound $230-430 lower; at 3 plans $60-120 dearer).
PER_LEADER = 5
NEAR_SHARE = 0.02  # their threshold: this share of the LP value per job, times the group size
# Column generation stops once its bound is this close to the LP (100 RH jobs: from 0.008 % to 0 took
# 2.5 of 30 s; at 0.25 % 300 Mixed jobs stopped unsettled, and the dive from there ended 1 % dearer).
CG_GAP = 0.0005
SMALL_MASTER = 3_000
WHOLE_MASTER = 8_000  # columns CBC solves whole (100 RH jobs: 1.2 % above the LP, the search 5 %)
DIVE_NOISE = 0.5  # dives after the first rank fractional columns by value times a factor in [1, 1.5)
AREA_ROUNDS = 3  # pricing rounds per neighbourhood of the search (``_price_area``)
STALE_DIVES = 10  # dives stop after this many in a row found only plans found before
EXACT_CHECK_S = 0.05  # CP-SAT's time on a group whose orders are too many to enumerate
PARALLEL_JOBS = 50  # jobs from which exact pricing runs in parallel: the caller, a worker process per other thread


@dataclass
class OptimalResult:
    plan: Plan
    mode: str = "enumerate"  # enumerate | colgen
    lp_iterations: int = 0
    master_solves: int = 0
    stats: dict = field(default_factory=dict)


def plan_optimal(model: PlanningModel, *, max_group_size: int = 5, time_limit_s: float = 60.0, threads: int = 2,
                 progress: Progress | None = None, solver: str = "auto", start: Plan | None = None,
                 pinned: Sequence[GroupPlan] = (), extra: Mapping[str, float] | None = None,
                 enumeration_budget: int = ENUMERATION_BUDGET) -> OptimalResult:
    """Minimum-cost plan. ``pinned`` groups may be kept on their nodes at no extra charge; ``extra``
    charges a job (by name) whenever it lands anywhere else (``replan``'s migration cost).

    The steps, in order: columns from the templates and the candidates, the LP (column generation),
    the integer master with every chosen group's timetable, then the plan with its bound, passed by the independent checker."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r} (solvers: {', '.join(SOLVERS)})")
    kernel.warm()  # compiled before the clock starts
    s = _Solve.begin(model, TimeBudget(time_limit_s), threads, progress, max_group_size, extra or {})
    _add_templates(s, start, pinned)
    _enumerate(s, enumeration_budget)
    _solve_lp(s)
    try:
        _prepare_master(s, solver)
        _solve_master(s)
        _collect_proof(s)
    finally:
        if s.proof is not None:
            s.proof[0].terminate()
    s.result.plan = _checked(_final_plan(s), s)
    return s.result


@dataclass
class _Solve:
    """One solve's state as its steps go: the columns, the best known plan, the LP, the bounds."""
    model: PlanningModel
    budget: TimeBudget
    threads: int
    say: Progress
    max_group_size: int
    job_ids: list[int]  # the admissible jobs
    refused: list[Rejection]  # the others, with their reasons (planner/optimal.py _admissible)
    index: dict[str, int]  # job name -> index
    charge: dict[int, float]  # job -> migration charge wherever it moves
    penalty: float  # $/h the master charges per rejected job
    result: OptimalResult
    allowed: frozenset[int] = frozenset()  # the admissible jobs, as a set
    columns: list[Column] = field(default_factory=list)
    seen: dict = field(default_factory=dict)  # column key -> index
    heuristic: Plan | None = None  # the weave plan: the fallback when nothing is verified in time
    hint: Incumbent | None = None  # the best known plan: the integer master's hint
    builder: CandidateBuilder | None = None
    large: bool = False  # column generation, or more columns than CP-SAT solves exactly
    lagrangian: float | None = None  # column generation's bound, when a pricing was proven
    proof: tuple | None = None  # (process, pipe): column generation going on (``_bound_later``)
    proven: list[float] = field(default_factory=list)  # the bounds it sent
    lp_state: LpState | None = None
    pools: SharedPools | None = None  # the sets of jobs that may time-share a pool: columns from the start
    solver: str = "auto"
    exclusive: list[list[int]] = field(default_factory=list)  # pinned columns holding the same node
    banned: set[int] = field(default_factory=set)  # columns the master may not choose
    unsure: set[int] = field(default_factory=set)  # columns banned without a proof that they have no timetable
    whole: bool = True  # the master is solved over every column (else the neighbourhood search only)
    support: dict[int, list[int]] = field(default_factory=dict)  # job -> the LP's columns: the search's neighbourhoods
    master: IntegerResult | None = None
    early: Plan | None = None  # the best plan mended after a failed verification
    timetables: dict = field(default_factory=dict)  # column -> its timetable, across master solves
    verified: dict = field(default_factory=dict)  # chosen column -> its members, nodes, timetable

    @classmethod
    def begin(cls, model: PlanningModel, budget: TimeBudget, threads: int, progress: Progress | None,
              max_group_size: int, extra: Mapping[str, float]) -> "_Solve":
        refused, job_ids = _admissible(model)
        index = {name: i for i, name in enumerate(model.jobs.names)}
        return cls(model=model, budget=budget, threads=threads, say=progress or (lambda _msg: None),
                   max_group_size=max_group_size, job_ids=job_ids, allowed=frozenset(job_ids), refused=refused,
                   index=index, charge={index[n]: v for n, v in extra.items() if n in index},
                   penalty=reject_penalty(model.topology), result=OptimalResult(plan=None))  # type: ignore[arg-type]

    @property
    def topo(self):
        return self.model.topology

    def add(self, column: Column) -> bool:
        if column.key in self.seen or not self.allowed.issuperset(column.jobs):
            return False
        self.seen[column.key] = len(self.columns)
        self.columns.append(column)
        return True

    def incumbent(self, chosen: list[int]) -> Incumbent:
        """The plan of the ``chosen`` columns, every other job rejected."""
        covered = {j for i in chosen for j in self.columns[i].jobs}
        return Incumbent(chosen, [j for j in self.job_ids if j not in covered])

    def objective(self, plan: Incumbent) -> float:
        return sum(self.columns[i].objective for i in plan.columns) + self.penalty * len(plan.rejected)

    def offer(self, plan: Incumbent) -> None:
        """``plan`` becomes the hint when it is the first or cheaper."""
        if self.hint is None or self.objective(plan) < self.objective(self.hint):
            self.hint = plan

    def lp_bound(self) -> float | None:
        """Column generation's bound, valid when every set of jobs that may share a pool is a column."""
        return self.lagrangian if self.pools_complete else None

    @property
    def pools_complete(self) -> bool:
        return self.pools is None or self.pools.complete

    def still_fits(self, column: Column) -> bool:
        """A previous plan's or pinned group still has a timetable that meets every SLO: its own, when
        the checker finds it valid under today's profiles (no solver; a group less one member keeps
        its timetable), else one found again while the templates' share of the time lasts (a replan
        of 100 live groups, each also pinned less each member, spent minutes in CP-SAT here)."""
        group = column.template
        alone = Plan(policy="optimal", quantile=self.model.quantile, topology=self.topo.name,
                     cost_usd_per_hour=column.cost, solver=SolverInfo(name="none", status="TEMPLATE"), groups=[group])
        if not check_plan(alone, self.topo, JobSet(jobs=tuple(self.model.jobs[j.name] for j in group.jobs))):
            return True
        left = self.budget.by(TEMPLATES_END) - time.perf_counter()
        return column_timetable(self.model, column, time_limit_s=min(1.0, max(0.0, left)), threads=self.threads).ok


def _add_templates(s: _Solve, start: Plan | None, pinned: Sequence[GroupPlan]) -> None:
    """The weave heuristic's plan and the previous one (``start``), both feasible starting points,
    so the result is never worse than either; the pinned groups; every job's single-job layouts
    that candidates do not express. A previous plan's and the pinned groups met other profiles:
    only those whose timetable still meets every SLO enter."""
    from weave_rl.planner.baselines import plan_weave

    s.heuristic = plan_weave(s.model, max_group_size=s.max_group_size)
    sources = [(True, s.heuristic)]  # (trusted, plan): a previous plan's groups met other profiles
    if start is not None:
        known = set(s.model.jobs.names)
        sources.append((False, start.model_copy(update={"groups": [
            g for g in start.groups if all(j.name in known for j in g.jobs)]})))
    for trusted, source in sources:
        chosen = []
        for group in source.groups:
            column = template_column(s.model, group, extra=sum(s.charge.get(s.index[j.name], 0.0) for j in group.jobs))
            if column.key not in s.seen and (trusted or s.still_fits(column)):
                s.add(column)
            if column.key in s.seen:
                chosen.append(s.seen[column.key])
        s.offer(s.incumbent(chosen))
    kept: list[int] = []
    for group in pinned:
        if all(j.name in s.index for j in group.jobs):
            column = template_column(s.model, group, pinned=True)
            if column.key in s.seen or not s.still_fits(column) or not s.add(column):
                continue
            if not set(column.jobs) & {j for i in kept for j in s.columns[i].jobs} \
                    and _conflict_free(s.columns, kept + [s.seen[column.key]]):
                kept.append(s.seen[column.key])  # keeping everything where it still fits: a starting point
    if kept:
        s.offer(s.incumbent(kept))
    s.say(f"{len(s.columns)} template groups")
    # In the LP from the start, so that column generation's bound covers them (no column of a
    # solved LP has a negative reduced cost).
    s.pools = shared_pools(s.model, [s.model.jobs.jobs[j] for j in s.job_ids], s.max_group_size)
    for group in _single_layouts(s.model, s.job_ids) + [group for _, group in s.pools.groups]:
        s.add(template_column(s.model, group, extra=sum(s.charge.get(s.index[j.name], 0.0) for j in group.jobs)))


def _enumerate(s: _Solve, budget: int) -> None:
    """Every candidate group when they fit the enumeration's budget (the master is then exact),
    else column generation prices them; every job's cheapest candidate alone either way, so that
    rounding the LP can always place a job alone."""
    s.builder = builder = CandidateBuilder(s.model, s.job_ids, s.max_group_size, budget=budget,
                                           deadline=s.budget.by(ENUMERATION_END))
    try:
        if builder.hopeless():
            raise EnumerationBudget("too many pairs to enumerate")
        for cand in builder.build():
            s.add(_candidate_column(cand, s.charge))
        s.result.mode = "enumerate" if builder.complete else "colgen"
        s.say(f"{len(s.columns)} columns (complete enumeration)" if builder.complete else "enumeration truncated")
    except EnumerationBudget:
        s.result.mode = "colgen"
        builder.complete = False
    s.large = s.result.mode == "colgen" or len(s.columns) > SMALL_MASTER
    for cand in _singletons(builder):
        s.add(_candidate_column(cand, s.charge))


def _solve_lp(s: _Solve) -> None:
    """The LP: its bound, its dives as starting plans. A complete enumeration needs no pricing."""
    try:
        s.lagrangian, s.lp_state = _column_generation(s, price=s.result.mode == "colgen")
    except LpTrouble as exc:  # no LP bound this time: the integer master still runs on the columns
        s.say(str(exc))
        s.result.stats["lp_trouble"] = str(exc)


def _prepare_master(s: _Solve, solver: str) -> None:
    """The master's solver, its hint (the best dive, when cheaper than the weave plan) and the LP's support."""
    s.exclusive = _shared_nodes(s.columns)
    # Measured in bench/planner_scale.py: CBC's LP-based search suits large masters with a tight
    # LP; CP-SAT solves small complete enumerations exactly.
    s.solver = ("pulp" if s.large else "cpsat") if solver == "auto" else solver
    # A large master is solved whole when CBC can take its columns and its LP has settled (an
    # unsettled LP guides CBC poorly: the neighbourhood search does better).
    s.whole = not s.large or (len(s.columns) <= WHOLE_MASTER and s.lagrangian is not None)
    state = s.lp_state
    if state is None:
        return
    if state.dive is not None and _conflict_free(s.columns, state.dive):
        s.offer(s.incumbent(state.dive))
    s.say(f"best known plan: ${s.objective(s.hint):,.2f}")
    for i, v in enumerate(state.x):
        if v > 1e-6:
            for j in s.columns[i].jobs:
                s.support.setdefault(j, []).append(i)


def _solve_master(s: _Solve) -> None:
    """The integer master, then a timetable for each group it chose. A group without one is banned
    and the master re-solved (the plan mended at the first failure kept); the plan, unless at the bound,
    is then improved by the neighbourhood search. The LP bound is already known: the master need not
    prove much, it must leave time for the timetables."""
    master_end = s.budget.by(MASTER_END)
    while s.job_ids:
        left = s.budget.left()
        if left <= 0.05:
            return
        if s.whole or s.hint is None:
            allowed = [i for i in range(len(s.columns)) if i not in s.banned]
            master = solve_integer(s.columns, s.job_ids, s.topo, allowed=allowed, penalty=s.penalty,
                                   time_limit_s=max(min(1.0, left / 3), master_end - time.perf_counter()),
                                   threads=s.threads, solver=s.solver, hint=s.hint, exclusive=s.exclusive)
        else:  # too large to solve whole: the neighbourhood search improves the best known plan
            master = IntegerResult("UNKNOWN", [], [], None, None)
        s.result.master_solves += 1
        if master.objective is None and s.hint is not None:  # none in time, or none sought: the best known plan
            master = IntegerResult("FEASIBLE", list(s.hint.columns), list(s.hint.rejected), s.objective(s.hint), None)
        if not master.chosen and len(master.rejected) < len(s.job_ids):
            s.master = None
            return
        s.master = master
        s.say(f"master {s.result.master_solves}: ${master.objective:,.2f}/h ({master.status})")
        failed = _verify(s.model, s.columns, master.chosen, s.verified, s.banned, s.budget.deadline, s.threads,
                         s.timetables)
        if failed is None:  # out of time before every group had a timetable (repaired later)
            return
        if failed:
            s.unsure.update(i for i in failed if s.timetables[i].status != "INFEASIBLE")
            _mend(s, master, failed)
            continue
        bound = s.lp_bound()
        at_bound = bound is not None and master.objective <= bound * (1 + 1e-6) + 1e-6
        # The search verifies every group it takes: it may run until every search stops.
        if master.status != "OPTIMAL" and not at_bound and s.budget.left() > 0.5:
            s.master = _search_neighbourhoods(s, master)
        return


def _mend(s: _Solve, master: IntegerResult, failed: list[int]) -> None:
    """After groups of the master's plan failed their timetables: the verified groups with the
    failed groups' jobs admitted around them are kept in case the master's next plans do no better
    in the time left, and their groups become columns; a set of jobs whose kept configurations all
    failed gets its next one. The mended plan is the next master's hint (unless the hint so far,
    none of whose groups failed, is cheaper): feasible and verified, where the plan less the failed
    groups (their jobs rejected) leaves the master a hint it must far improve on (100 Hetero jobs: a
    1 s master after two failures returned $38k/h from it)."""
    verified_groups = [group_plan(s.model, f"g{gi}", *s.verified[i]) for gi, i in enumerate(
        i for i in master.chosen if i in s.verified and i not in failed)]
    mended = _repair(s.model, verified_groups, [j for i in failed for j in s.columns[i].jobs] + master.rejected,
                     s.max_group_size)
    if s.early is None or _worse(s.early, mended):
        s.early = mended
    for i in failed:
        cand = s.columns[i].candidate
        spare = s.builder.reserve.get(cand.jobs) if cand is not None else None
        if spare:
            s.add(_candidate_column(spare.pop(0), s.charge))
    chosen = []
    for group in mended.groups:
        column = template_column(s.model, group, extra=sum(s.charge.get(s.index[j.name], 0.0) for j in group.jobs))
        s.add(column)
        if column.key in s.seen and s.seen[column.key] not in s.banned:
            chosen.append(s.seen[column.key])
    kept = [i for i in master.chosen if i not in s.banned]
    if len(chosen) < len(mended.groups) or s.objective(s.incumbent(chosen)) > s.objective(s.incumbent(kept)):
        chosen = kept
    # The hint so far stays when none of its groups failed and it is cheaper (100 Hetero jobs s1: the
    # dives' $3,067.84 gave way to a dearer mended plan, and the next master ended at $3,122.72).
    mended_hint = s.incumbent(chosen)
    if s.hint is None or s.banned.intersection(s.hint.columns) or s.objective(mended_hint) < s.objective(s.hint):
        s.hint = mended_hint


def _collect_proof(s: _Solve) -> None:
    """The best bound column generation in the background (``_bound_later``) proved by the searches' end."""
    if s.proof is not None:
        _background(s, wait_until=s.budget.deadline + 0.05)
        s.proof[0].terminate()
        s.proof[0].join()
        s.proof = None
        s.say(f"column generation in the background: {len(s.proven)} complete pricing(s) in time"
              + (f", bound ${max(s.proven):,.2f} (each: {', '.join(f'${b:,.2f}' for b in s.proven)})" if s.proven else ""))
        s.lagrangian = max([b for b in s.proven + [s.lagrangian] if b is not None], default=None)


def _background(s: _Solve, wait_until: float = 0.0) -> list[int]:
    """What column generation in the background sent by ``wait_until``: its bounds join ``s.proven``; its
    columns (each leader's best group at its latest duals) join the LP's support, and are returned."""
    fresh: list[int] = []
    while s.proof is not None and s.proof[1].poll(max(0.0, wait_until - time.perf_counter())):
        try:
            bound, cands = s.proof[1].recv()
        except (EOFError, OSError):  # it has ended: the LP settled, or GLOP failed
            break
        s.proven.append(bound)
        for column in (_candidate_column(cand, s.charge) for cand in cands):
            if s.add(column):
                fresh.append(len(s.columns) - 1)
                for j in column.jobs:
                    s.support.setdefault(j, []).append(fresh[-1])
    return fresh


def _bound_later(lp: LpMaster, builder: CandidateBuilder, charge: Mapping[int, float], k_groups: int,
                 deadline: float) -> tuple | None:
    """Column generation goes on in a forked process once the solve moves on unsettled (the solve's
    steps leave a core idle): complete pricings at the LP's duals, each round's Lagrangian bound and
    columns sent back (``_background``), until the LP settles or ``deadline``. The bound at one round's
    duals is far from the next one's (300 Hetero jobs s3: $8,093 at round 40, $8,536 at round 42).
    Returns (process, pipe), or None without fork."""
    try:
        context = multiprocessing.get_context("fork")
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(target=_go_on, args=(lp, builder, charge, k_groups, deadline, writer), daemon=True)
        process.start()
    except (ValueError, OSError):
        return None
    writer.close()
    return process, reader


def _go_on(lp: LpMaster, builder: CandidateBuilder, charge: Mapping[int, float], k_groups: int, deadline: float,
           writer) -> None:
    """``_bound_later``'s process. Each leader's best group is all the bound needs, and columns enough."""
    while True:
        try:
            value, pi, mu = lp.solve(deadline)
        except LpTrouble:
            return
        priced = price_exact(builder, pi, mu, extra=charge, deadline=deadline, max_columns=len(pi) + 1, per_leader=1)
        if not priced.proven:
            return
        bound = value + max(k_groups * priced.rc_lower_bound, priced.rc_sum_bound)
        writer.send((bound, priced.columns))
        if not priced.columns or value - bound <= CG_GAP * max(1.0, abs(value)):
            return
        for cand in priced.columns:
            lp.add(_candidate_column(cand, charge))


def _placed_groups(s: _Solve) -> tuple[list[GroupPlan], list[int], Plan | None, str]:
    """The groups of the plan returned, the jobs it rejects, and the plan they were repaired into
    (with why) when that is not the master's: when time ran out before every chosen group had a
    timetable, the verified groups with the other jobs admitted around them (NoPlanInTime when the
    weave plan is better), or the plan mended at the first failed verification, when cheaper."""
    master = s.master
    chosen = master.chosen if master else []
    order = sorted(chosen, key=lambda i: (not s.columns[i].pinned, s.columns[i].jobs))
    groups = [group_plan(s.model, f"g{gi}", *s.verified[i]) for gi, i in enumerate(i for i in order if i in s.verified)]
    lost = master.rejected if master else []
    repaired, why = None, "time ran out verifying the master's plan: its verified groups, the other jobs admitted around them"
    if s.job_ids and (master is None or any(i not in s.verified for i in master.chosen)):
        if master is not None:
            repaired = _repair(s.model, groups, [j for i in chosen if i not in s.verified for j in s.columns[i].jobs]
                               + lost, s.max_group_size)
        if repaired is None or _worse(repaired, s.heuristic):
            bound = None
            if s.lp_bound() is not None and not (s.heuristic.rejected or s.charge):  # same jobs placed: comparable
                bound = max(s.lp_bound(), _simple_bound(s.model, s.job_ids, s.max_group_size))
            raise NoPlanInTime(f"no verified plan within {s.budget.limit_s:g} s", s.heuristic, bound)
        groups, lost = repaired.groups, _rejected_ids(s, repaired)
        s.say(f"repaired: {len(groups)} groups, ${repaired.cost_usd_per_hour:,.2f}/h")
    if s.early is not None and (len(s.early.rejected), s.early.cost_usd_per_hour) < \
            (len(lost), sum(g.usd_per_hour or 0.0 for g in groups)):
        repaired, why = s.early, "some groups of the master's plan have no timetable: the verified " \
            "groups, their jobs admitted around them"
        groups, lost = repaired.groups, _rejected_ids(s, repaired)
        s.say(f"mended after the first failed timetables: {len(groups)} groups, ${repaired.cost_usd_per_hour:,.2f}/h")
    return groups, lost, repaired, why


def _rejected_ids(s: _Solve, plan: Plan) -> list[int]:
    names = {r.name for r in plan.rejected}
    return [j for j in s.job_ids if s.model.jobs.jobs[j].name in names]


def _final_plan(s: _Solve) -> Plan:
    """The plan with its cost, its lower bound (always valid for the model: see the module's
    docstring), the gap, and a note on what the bound is and which jobs were not placed."""
    groups, lost, repaired, why_repaired = _placed_groups(s)
    jobs = s.model.jobs.jobs
    cost = round(sum(g.usd_per_hour or 0.0 for g in groups), 6)
    if repaired is not None:
        rejected = s.refused + list(repaired.rejected)
    else:
        rejected = s.refused + [Rejection(name=jobs[j].name, reason=not_placed_reason(s.model, jobs[j], groups,
                                                                                      s.max_group_size)) for j in lost]
    lb, note = _bound(s, lost, cost)
    gap = (cost - lb) / cost if cost > 0 else 0.0
    status = s.master.status if s.master else "OPTIMAL"
    if repaired is not None:
        status = "FEASIBLE"
        note = (note + "; " if note else "") + why_repaired
    if status == "OPTIMAL" and gap > 1e-6:
        status = "FEASIBLE"
    note = with_placement_note(note, len(jobs) - len(rejected), len(jobs))
    info = SolverInfo(name=s.solver, status=status, wall_s=round(s.budget.elapsed(), 3), gap=round(gap, 6),
                      objective=cost, bound=round(lb, 6), note=note)
    return Plan(policy="optimal", objective="cost", quantile=s.model.quantile, topology=s.topo.name,
                cost_usd_per_hour=cost, lower_bound_usd_per_hour=round(lb, 6), solver=info, groups=groups,
                rejected=rejected, elastic=dict(DEFAULT_ELASTIC))


def _checked(plan: Plan, s: _Solve) -> Plan:
    """``plan`` once the independent checker (planner/check.py) passes it. A violation is a planner
    bug; the user then gets the weave plan (status FALLBACK) with the broken rules named, never an
    invalid plan."""
    violations = check_plan(plan, s.topo, s.model.jobs)
    if not violations:
        return plan
    s.say("the plan checker rejects the optimal plan:\n" + format_violations(violations))
    rules = ", ".join(sorted({v.rule for v in violations}))
    raise NoPlanInTime(f"the optimal plan broke the plan checker's rules ({rules}): a planner bug, please report it",
                       s.heuristic, None)


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


def _shared_nodes(columns: list[Column]) -> list[list[int]]:
    """Pinned columns that hold the same physical node: at most one of each set may be chosen."""
    holders: dict[str, list[int]] = {}
    for i, col in enumerate(columns):
        if col.pinned:
            for n in col.template.nodes:
                holders.setdefault(n, []).append(i)
    return [sorted(set(h)) for h in {tuple(h) for h in holders.values() if len(h) > 1}]


def _conflict_free(columns: list[Column], chosen: list[int]) -> bool:
    nodes = [n for i in chosen if columns[i].pinned for n in columns[i].template.nodes]
    return len(nodes) == len(set(nodes))


def _single_layouts(model: PlanningModel, job_ids: list[int]) -> list[GroupPlan]:
    """Each job alone as the ``colocate`` policy lays it out (rollout and train taking turns on the
    same GPUs, at every GPU count and type that meets its SLO: planner/colocated.py), and as the
    ``solo`` policy does where its rollout and train share a node (one-cluster topologies; elsewhere
    a candidate is the same group). So the master places every job either baseline places alone."""
    from weave_rl.planner.baselines import plan_solo

    out = []
    for j in job_ids:
        job = model.jobs.jobs[j]
        out += [c.group for c in colocated_options(model, job)]
        if _may_share_a_cluster(model, job):
            solo = plan_solo(PlanningModel(model.topology, JobSet(jobs=(job,)), model.quantile)).groups
            if solo and _phases_share_a_node(solo[0]):
                out.append(solo[0])
    return out


def _may_share_a_cluster(model: PlanningModel, job) -> bool:
    types = {kind: set(job.phase(kind).gpu_types) for kind in ("rollout", "train")}
    return any(c.gpu_type in types["rollout"] and c.gpu_type in types["train"] for c in model.topology.clusters.values())


def _phases_share_a_node(group: GroupPlan) -> bool:
    job = group.jobs[0]
    nodes = {kind: {g.rpartition(":")[0] for g in job.phase(kind).gpus} for kind in ("rollout", "train")}
    return bool(nodes["rollout"] & nodes["train"])


def _singletons(builder: CandidateBuilder) -> list:
    out = []
    for j in builder.job_ids:
        pairs = [(t, o) for t in builder.train_opts[j] for o in builder.rollout_opts[j]
                 if fits_cap(builder.loop_s(j, t, o), builder.cap[j])]
        if pairs:
            t, o = min(pairs, key=lambda p: builder.price[p[0].cluster] * p[0].nodes
                       + builder.price[p[1].cluster] * p[1].nodes)
            out.append(make_candidate(builder, [j], t, [o], [[0]]))
    return out


def _candidate_column(cand, charge: Mapping[int, float]) -> Column:
    return Column(cand.jobs, cand.nodes, cand.cost, candidate=cand,
                  extra=round(sum(charge.get(j, 0.0) for j in cand.jobs), 6))


def _column_generation(s: _Solve, *, price: bool) -> tuple[float | None, "LpState | None"]:
    """Grow the columns by pricing until the LP is optimal, the bound meets it, or time runs out.
    Returns the best Lagrangian bound (None when no pricing was proven) and the LP with its dives.
    The groups found without a timetable join ``s.banned``."""
    model, builder, columns, add, job_ids, charge, penalty, result, threads, say = (
        s.model, s.builder, s.columns, s.add, s.job_ids, s.charge, s.penalty, s.result, s.threads, s.say)
    deadline, incumbent = s.budget.by(COLGEN_END), s.objective(s.hint) if s.hint else None
    dive_s, near_s, decide_s = (s.budget.lasting(share) for share in (DIVE, NEAR, DECIDE))
    lp = LpMaster(job_ids, model.topology, penalty)
    for column in columns:
        lp.add(column)
    k_groups = max_groups(model.topology, len(job_ids), incumbent)
    best = -math.inf
    rotation: dict = {}
    value = None
    greedy = True
    near_duals = None  # the duals at which column generation stopped converged
    # Pools of one training GPU count first (far quicker where jobs have several counts), then mixed
    # counts too once their LP is optimal: only a pricing over the whole model proves its bound.
    mixed = False
    covers = builder.uniform_pools()
    uniform_settled = None  # the duals at which no group of one count improves
    # Groups of mixed counts are in the LP (its bound is the model's) but closed to dives and master until
    # a timetable is found: the candidate rules are looser for them (100 Hetero jobs: plans failed).
    unverified: list[Column] = []

    def added(cands: list[Candidate]) -> list[Column]:
        fresh = [c for c in (_candidate_column(cand, charge) for cand in cands) if add(c)]
        unverified.extend(c for c in fresh if len({t.gpus for t in c.candidate.trains}) > 1)
        return fresh
    # Exact pricing costs groups in Python: with threads to spare, the caller and worker processes share the leaders.
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
                fresh = added(price_greedy(builder, pi, mu, extra=charge))
                greedy = len(fresh) >= 10  # once the heuristic dries up, the exact search takes over
            how = "greedy"
            if not fresh:  # search exactly, stopping early while columns abound
                pr = price_exact(builder, pi, mu, extra=charge, deadline=deadline, stop_after=300, rotation=rotation,
                                 pool=pool, mixed=mixed, per_leader=PER_LEADER,
                                 only_mixed=uniform_settled is not None and (pi, mu) == uniform_settled)
                if pr.proven and covers:
                    best = max(best, value + max(k_groups * pr.rc_lower_bound, pr.rc_sum_bound or -math.inf))
                fresh = added(pr.columns)
                how = "exact" + (", proven" if pr.proven else "") + (", mixed pools" if mixed else "")
                if not fresh and pr.proven and not covers:
                    say(f"column generation {result.lp_iterations}: LP ${value:,.2f} optimal over pools of one "
                        "training GPU count; now pools of mixed counts too")
                    mixed = covers = True
                    uniform_settled = (pi, mu)
                    continue
                if not fresh and pr.proven:
                    best = max(best, value)
                    say(f"column generation {result.lp_iterations}: LP ${value:,.2f} optimal")
                    near_duals = (value, pi, mu)
                    break
            for column in fresh:
                lp.add(column)
            say(f"column generation {result.lp_iterations}: LP ${value:,.2f}, bound ${best:,.2f}, "
                f"+{len(fresh)} columns ({how})")
            if value - best <= CG_GAP * max(1.0, abs(value)):
                near_duals = (value, pi, mu)
                break
        if near_duals is not None and time.perf_counter() < deadline:
            # Integer plans need columns the LP did not: collect those of small reduced cost.
            value, pi, mu = near_duals
            near = price_exact(builder, pi, mu, extra=charge, max_columns=NEAR_COLUMNS, pool=pool, mixed=mixed,
                               deadline=min(deadline, time.perf_counter() + near_s),
                               threshold=NEAR_SHARE * value / max(1, len(job_ids)) * builder.k)
            near_columns = added(near.columns)
            for column in near_columns:
                lp.add(column)
            say(f"columns near the LP optimum: +{len(near_columns)}")
    finally:
        if pool is not None:
            pool.close()
    if pool is not None and near_duals is None and value is not None:  # not settled: it goes on meanwhile
        s.proof = _bound_later(lp, builder, charge, k_groups, s.budget.deadline)
    result.stats["lp_value"] = value
    index = {id(column): i for i, column in enumerate(lp.columns)}
    if value is not None:
        # The LP's own groups of one count without a round robin are decided too (300 Hetero jobs s1:
        # four had none, the master's plan failed, and the one re-solved in 2 s was 1.5 % dearer).
        try:
            lp.solve()  # the last columns added too
            support = lp.values()
        except LpTrouble:
            support = []
        listed = {id(c) for c in unverified}
        unverified += [c for c, x in zip(lp.columns, support) if x > 1e-6 and c.candidate is not None
                       and id(c) not in listed and not _has_round_robin(model, c)]
        # those the integer plans most likely take first: least reduced cost
        unverified.sort(key=lambda c: c.objective - sum(pi[j] for j in c.jobs) - sum(mu.get(k, 0.0) * n
                                                                                     for k, n in c.nodes))
    decided_by = time.perf_counter() + decide_s
    decided: dict[int, bool | None] = {}  # column -> whether it has a timetable (None: undecided in time)
    for column in unverified:
        if time.perf_counter() >= decided_by:
            break
        decided[index[id(column)]] = _has_timetable(model, column, decided_by)
    closed = [i for i, ok in decided.items() if not ok]
    # Those not reached stay open to the dives, which decide the ones they would fix (300 Hetero jobs
    # s2: 929 of 2,663 not reached in 2.4 s); the master takes only groups with a timetable.
    late = [index[id(column)] for column in unverified if index[id(column)] not in decided]
    lp.close(closed)
    s.banned.update(closed + late)
    s.unsure.update(late + [i for i in closed if decided[i] is None])
    if unverified:
        say(f"groups of mixed training GPU counts, or in the LP's support without a round robin: "
            f"{len(decided) - len(closed)} have a timetable, {len(closed)} none (closed to dives and master), "
            f"{len(late)} not reached in time")
    state = None
    if value is not None:
        try:
            value, pi, mu = lp.solve()  # the last columns added too
        except LpTrouble:  # the LP of the last round (its columns, its duals) stands
            return (best if best > -math.inf else None), LpState(value, pi, mu, lp.last_x)
        state = LpState(value, pi, mu, lp.values())
        # Dives on the whole LP (warm re-solves) fix a few disjoint columns per round (one per 60 jobs).
        def dive_price(pi, mu, taken):
            pi = {j: (-1e9 if j in taken else v) for j, v in pi.items()}
            return added(price_greedy(builder, pi, mu, extra=charge))
        # Then dive again with the ranking perturbed (the columns priced so far stay) for the dive's
        # time; the cheapest plan is the search's start (300 Hetero jobs s2: $9,775-10,200, LP $9,376).
        end, per = time.perf_counter() + dive_s, max(1 + len(lp.columns) // 8000, len(job_ids) // 60)
        # A dive fixes only groups with a timetable, those without are closed (300 Hetero jobs s2: five
        # groups of one count in the dive's plan had none, and the master re-solved was $370/h dearer).
        timetabled = dict(decided)

        def usable(i: int) -> bool:
            if i not in timetabled:
                column = lp.columns[i]
                timetabled[i] = column.candidate is None or _has_round_robin(model, column) or \
                    _has_timetable(model, column, end)
                (s.banned.discard if timetabled[i] else s.banned.add)(i)
                if timetabled[i] is None:
                    s.unsure.add(i)
            return timetabled[i]
        best_cost, attempt, stale, plans = math.inf, 0, 0, set()
        while True:
            began = time.perf_counter()
            chosen = lp.dive(end, per=per, price=dive_price if price else None,
                             noise=0.0 if attempt == 0 else DIVE_NOISE, seed=attempt, usable=usable)
            if chosen is None:
                break
            cost = s.objective(s.incumbent(chosen))
            stale = stale + 1 if frozenset(chosen) in plans else 0
            plans.add(frozenset(chosen))
            if cost < best_cost - 1e-6:
                state.dive, best_cost = chosen, cost
            attempt += 1
            lp.unfix()
            # No dive beats the LP, and dives that only repeat earlier plans have run dry.
            if best_cost <= state.value + 1e-6 or stale >= STALE_DIVES \
                    or end - time.perf_counter() < 1.5 * (time.perf_counter() - began):
                break
        if state.dive is None:  # out of time: the dive's last LP guides the search instead
            state.x = lp.last_x[:len(columns)]
        say(f"LP dive: {'out of time' if state.dive is None else f'{attempt} dive(s), best ${best_cost:,.2f}'}")
    return (best if best > -math.inf else None), state


def _has_round_robin(model: PlanningModel, column: Column) -> bool:
    """Whether the round robin (constant time) meets every member's SLO."""
    return column_timetable(model, column, time_limit_s=0.0).ok


def _has_timetable(model: PlanningModel, column: Column, deadline: float) -> bool | None:
    """Whether a timetable is found (planner/cyclic.py: milliseconds for small groups) by ``deadline``;
    None when that is not decided in time."""
    if time.perf_counter() >= deadline:
        return None
    members, _ = materialize(model, column, NodeAllocator(model.topology))
    tt = exact_timetable(model, members, time_limit_s=EXACT_CHECK_S, threads=1, least=False)
    return tt.ok or (None if tt.status != "INFEASIBLE" else False)


@dataclass
class LpState:
    value: float
    pi: dict
    mu: dict
    x: list[float]
    dive: list[int] | None = None  # columns of an integral solution found by diving


def _search_neighbourhoods(s: _Solve, master: IntegerResult) -> IntegerResult:
    """The master's verified plan improved over every column it may use (planner/lns.py), each
    improvement only with a timetable for every new group; the plan returned is laid out in
    ``s.verified``."""
    model, columns = s.model, s.columns
    start = Incumbent(list(master.chosen), list(master.rejected), master.objective)
    # The groups banned only because no timetable was decided in time are open to the search, which
    # decides each it takes (300 Hetero jobs s1/s2, 7 s: $9,385 and $9,693 with them, $9,430 and $9,748 without).
    banned = s.banned - (s.unsure - s.timetables.keys())
    better = search(columns, s.job_ids, model.topology, start, banned=banned, penalty=s.penalty,
                    deadline=s.budget.deadline, exclusive=s.exclusive, support=s.support,
                    seed=s.result.master_solves, known=s.timetables, more=lambda: _background(s),
                    decide=lambda i, limit_s: column_timetable(model, columns[i], time_limit_s=limit_s),
                    price=lambda area: _price_area(s, area),
                    duals=None if s.lp_state is None else (s.lp_state.pi, s.lp_state.mu))
    if better.objective >= master.objective - 1e-6:
        return master
    s.say(f"neighbourhood search: ${better.objective:,.2f}/h")
    improved = IntegerResult("FEASIBLE", better.columns, better.rejected, better.objective, None)
    # Every group has its timetable already (kept, or accepted above): laying it out takes no search.
    for plan in (improved, master):
        if _verify(model, columns, plan.chosen, s.verified, set(), math.inf, s.threads, s.timetables) == []:
            return plan
    return master


def _price_area(s: _Solve, area: set[int]) -> list[int]:
    """Column generation over a neighbourhood's jobs alone (the LP of its columns, priced exactly, a few
    rounds); the columns added. 300 Hetero jobs s2: a dive's groups of one or two held 75 % of its excess."""
    jobs = sorted(area)
    lp, builder = LpMaster(jobs, s.topo, s.penalty), CandidateBuilder(s.model, jobs, s.max_group_size)
    for i, column in enumerate(s.columns):
        if i not in s.banned and area.issuperset(column.jobs):
            lp.add(column)
    first = len(s.columns)
    for _ in range(AREA_ROUNDS):
        try:
            _, pi, mu = lp.solve(s.budget.deadline)
        except LpTrouble:
            break
        added = [column for column in (_candidate_column(cand, s.charge) for cand in price_exact(
            builder, pi, mu, extra=s.charge, deadline=s.budget.deadline).columns) if s.add(column)]
        for column in added:
            lp.add(column)
        if not added:
            break
    return list(range(first, len(s.columns)))


def _verify(model, columns, chosen, verified, banned, deadline, threads, timetables) -> list[int] | None:
    """Lay out and timetable every chosen column; ban those without a timetable. Returns those that
    failed, or None when time ran out first. A column's timetable does not depend on which
    nodes of its clusters it gets, so ``timetables`` keeps it across master solves."""
    reserved = {n for i in chosen if columns[i].pinned for n in columns[i].template.nodes}
    free = NodeAllocator(model.topology, reserved)
    verified.clear()  # nodes laid out for an earlier master's plan may clash with this one's
    failed: list[int] = []
    order = sorted(chosen, key=lambda i: not columns[i].pinned)
    laid_out = {i: materialize(model, columns[i], free) for i in order}
    for i in order:  # the round robins first: constant time each
        if i not in timetables:
            tt = group_timetable(model, laid_out[i][0], time_limit_s=0.0, threads=threads)
            if tt.ok:
                timetables[i] = tt
    # Then the exact timetables, each its share of the time left (300 Hetero jobs: three took 2 s each,
    # the groups after them went unverified, and the repaired plan was 9 % dearer).
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
            failed.append(i)
    return failed


def _simple_bound(model: PlanningModel, job_ids: list[int], max_group_size: int) -> float:
    """The bounds that need no LP: work, and nodes as bins (planner/optimal.py)."""
    return max(work_lower_bound(model, job_ids), packing_lower_bound(model, job_ids, max_group_size))


def _bound(s: _Solve, lost: list[int], cost: float) -> tuple[float, str | None]:
    """The plan's lower bound (see the module's docstring), and what its note says about it."""
    # A master's own bound holds for the columns it saw only: not after columns were banned without
    # a proof that they have no timetable.
    master = s.master.bound if s.master is not None and s.result.mode == "enumerate" \
        and s.pools_complete and not s.banned & s.unsure else None
    bounds = [b for b in (master, s.lp_bound()) if b is not None]
    note = None if bounds else "column generation proved no bound in time: the bound is the work or packing bound"
    # The master's objective includes rejections and migration charges; the plan's cost does not.
    lb = max(bounds, default=0.0) - s.penalty * len(lost) - sum(s.charge.values())
    if not lost:
        lb = max(lb, _simple_bound(s.model, s.job_ids, s.max_group_size))
    if s.master is None and s.job_ids:
        note = "no plan verified"
    if not s.pools_complete:
        note = f"more sets of jobs may time-share a pool than the {len(s.pools.groups):,} made columns: the " \
               "bound is the work or packing bound"
    return min(max(lb, 0.0), cost), note
