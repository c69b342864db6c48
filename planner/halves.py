"""A plan built half by half: rollout classes first, then those classes packed into training pools.

A group's cost is its training pool's nodes plus its rollout classes' nodes. Dropping the coupling
between the two leaves two bin-packing problems over the jobs:
- training pools: at most ``k`` jobs on one training option (GPU type, cluster, GPU count), their
  trains and warm switches within the pool's smallest cycle cap ``slo * solo`` and their host memory
  within a node's; a pool of one always fits;
- rollout classes: at most ``k`` jobs in one cluster on ``max(nodes)`` nodes, their rollouts (and
  warm switches) summed over nodes within the class's node-seconds at the smallest cap, and their
  host memory within the nodes'; a class of one always fits;
- in either, each member's own loop (at best, over its other phase's options) within the bin's
  smallest cap: a group's cap is at most the bin's.
Each half is a set-partitioning LP over bins, solved by column generation whose exact pricing is a
depth-first knapsack per *leader* (the bin's member of smallest cap, ties by index); CP-SAT then
picks bins over the generated ones, the LP's bound its target. ``decomposed_plan`` packs the
rollout half's chosen classes (as items whose pieces bring their rollout nodes along) into training
pools the same way.

For plans whose nodes each host one kind of phase (``phases_apart``). Where column generation over
whole groups has not settled in the time (300 RH jobs in 30 s), this plan is 1-3 % cheaper than
the dives' (planner/optimize.py ``_plan_by_halves``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from weave_rl.planner.optimal import Candidate, CandidateBuilder, PhaseOption, make_candidate
from weave_rl.planner.rules import TIME_TOL as TOL, class_layout, fits_cap, fits_memory, group_cap, load_s

EPS = 1e-7


@dataclass(frozen=True)
class Piece:
    """One item (a job, or a class of jobs) on one option: what a bin adds up."""

    item: int
    key: tuple  # the bin's shared option: (gpu type, cluster, GPUs) for training, cluster for rollout
    cluster: str
    nodes: int
    busy_s: float  # duration plus warm switch (a shared bin switches)
    mem_gb: float
    jobs: tuple[int, ...] = ()  # the jobs it covers (the item's own when empty)
    cost: float = 0.0  # $/h it adds to any bin (a rollout class inside a training pool)
    need_s: float = 0.0  # the least cap of a bin it fits in

    @property
    def covers(self) -> tuple[int, ...]:
        return self.jobs or (self.item,)

    @property
    def size(self) -> int:
        return len(self.covers)


@dataclass
class HalfBound:
    kind: str  # "train" | "rollout" | "pools" (the second step)
    bound: float  # no partition of the items into these bins costs less
    lp_value: float
    proven: bool  # the LP was solved to optimality (else the bound is the Lagrangian one, or 0)
    columns: int
    rounds: int


def half(builder: CandidateBuilder, kind: str) -> "Packing":
    """The jobs' training (or rollout) phases as items of a bin packing."""
    pieces, options = {}, {}
    for j in builder.job_ids:
        pieces[j] = []
        # Only options some candidate can use: the job's own loop within its cap on them.
        usable = [(t if kind == "train" else o) for t in builder.train_opts[j] for o in builder.rollout_opts[j]
                  if fits_cap(builder.loop_s(j, t, o), builder.cap[j])]
        for o in dict.fromkeys(usable):
            # Its own loop on this option (at best) bounds the cap of any group it joins.
            loop = min(builder.loop_s(j, t, r) for t in builder.train_opts[j] for r in builder.rollout_opts[j]
                       if (t if kind == "train" else r) == o)
            p = Piece(j, (o.gpu_type, o.cluster, o.gpus) if kind == "train" else o.cluster, o.cluster, o.nodes,
                      load_s(o, True), o.host_mem_gb, need_s=loop)
            pieces[j].append(p)
            options[p] = o
    packing = Packing(kind, pieces, builder.cap, builder)
    packing.options = options
    return packing


def solve_lp(solver: pywraplp.Solver, deadline: float) -> bool:
    """GLOP within the time left until ``deadline``: whether it found the optimum."""
    solver.SetTimeLimit(max(1, int(1000 * (deadline - time.perf_counter()))))
    return solver.Solve() == pywraplp.Solver.OPTIMAL


def phases_apart(builder: CandidateBuilder) -> bool:
    """No cluster offers both a rollout and a training option: every node hosts one kind of phase."""
    rollout = {o.cluster for j in builder.job_ids for o in builder.rollout_opts[j]}
    train = {t.cluster for j in builder.job_ids for t in builder.train_opts[j]}
    return not rollout & train


def decomposed_plan(builder: CandidateBuilder, deadline: float, threads: int = 1) -> list[Candidate]:
    """A plan built half by half. First the rollout classes of least cost (the rollout half's LP,
    then CP-SAT over its bins). Then those classes packed into training pools of least cost the
    same way: a class fits a pool whose cap holds its rollouts and every member's loop, and a pool
    costs its training nodes plus its classes' rollout nodes. Returns the groups (empty when out of
    time or when no plan comes from there).

    Measured on 300 RH jobs (3.6 s): $5,733 / $5,820 / $5,686 against $5,896 / $5,727 / $5,708 for
    the first dive of column generation at 20 s. Letting a pool break a class up (each member
    alone as another unit) gave a pool LP 2-3 % lower, but took 10 s, and CP-SAT's plans over its
    bins were no better in 15 s more."""
    # The rollout half's LP first (its bound is CP-SAT's target), up to 45 % of the time; each
    # CP-SAT gets a sixth.
    budget = deadline - time.perf_counter()
    rollout = half(builder, "rollout")
    bound = rollout.solve(time.perf_counter() + 0.45 * budget).bound
    classes = rollout.integer(min(1.0, budget / 6), threads, target=bound or None)
    if classes is None:
        return []
    # Classes become items (units); each has a piece per training option all its members share.
    # A class that fits no pool alone (no layout, or a member's loop beyond the class's cap on
    # every shared option: the half is a relaxation) is split into its members.
    waiting = [[(p.item, rollout.options[p]) for p in members] for members, _ in classes]
    units: list[list[tuple[int, PhaseOption]]] = []
    pieces: dict[int, list[Piece]] = {}
    cap: dict[int, float] = {}
    trains_of: dict[Piece, list[PhaseOption]] = {}
    while waiting:
        unit = waiting.pop()
        u = len(units)
        found = _unit_pieces(builder, u, unit, trains_of)
        if not found and len(unit) > 1:
            waiting += [[m] for m in unit]
            continue
        if not found:
            return []  # no training option fits this job alone: no plan from here
        units.append(unit)
        pieces[u] = found
        cap[u] = min(builder.cap[j] for j, _ in unit)
    pools = Packing("pools", pieces, cap, builder)
    pool_bound = pools.solve(deadline - min(1.0, budget / 6)).bound
    chosen = pools.integer(max(0.05, deadline - time.perf_counter()), threads, target=pool_bound or None)
    if chosen is None:
        return []
    groups = []
    for members, _ in chosen:
        jobs, train, rollouts, parts = [], {}, {}, []
        for p in members:
            parts.append([j for j, _ in units[p.item]])
            for (j, o), t in zip(units[p.item], trains_of[p]):
                jobs.append(j)
                train[j], rollouts[j] = t, o
        jobs.sort()
        at = {j: i for i, j in enumerate(jobs)}
        least_cap = group_cap(builder.cap[j] for j in jobs)
        classes_at = [[at[j] for j in part] for part in parts]
        offsets = [0] * len(jobs)
        for part, positions in zip(parts, classes_at):
            opts = [rollouts[j] for j in part]
            first = class_layout(opts, least_cap, builder.topo.clusters[opts[0].cluster].host_mem_gb)
            if first is None:
                return []  # a class that does not fit its pool's cap: no plan from here
            for i, f in zip(positions, first):
                offsets[i] = f
        groups.append(make_candidate(builder, jobs, [train[j] for j in jobs], [rollouts[j] for j in jobs], classes_at,
                                     offsets))
    return groups


def _unit_pieces(builder: CandidateBuilder, u: int, unit: list[tuple[int, PhaseOption]],
                 trains_of: dict) -> list[Piece]:
    """A rollout class's pieces as an item of the training pools: one per training option its
    members share on which every member's loop and the class's layout fit the class's cap."""
    jobs = [j for j, _ in unit]
    cap = group_cap(builder.cap[j] for j in jobs)
    need = 0.0
    if len(unit) > 1:
        need = _class_need(builder, unit)
        if need is None:
            return []
    opts = [o for _, o in unit]
    rollout_cost = builder.price[opts[0].cluster] * max(o.nodes for o in opts)
    keys = set.intersection(*({(t.gpu_type, t.cluster, t.gpus) for t in builder.train_opts[j]} for j in jobs))
    found = []
    for key in sorted(keys):
        trains = [next(t for t in builder.train_opts[j] if (t.gpu_type, t.cluster, t.gpus) == key) for j in jobs]
        loop = max(builder.loop_s(j, t, o) for (j, o), t in zip(unit, trains))
        p = Piece(u, key, key[1], trains[0].nodes, sum(load_s(t, True) for t in trains),
                  sum(t.host_mem_gb for t in trains), tuple(jobs), rollout_cost, max(need, loop))
        # A class of two jobs or more already shares its pool: their trains must fit it too.
        shared = len(jobs) == 1 or (fits_cap(p.busy_s, cap) and fits_memory(p.mem_gb, builder.topo.clusters[key[1]].host_mem_gb))
        if shared and fits_cap(p.need_s, cap):
            found.append(p)
            trains_of[p] = trains
    return found


def _class_need(builder: CandidateBuilder, unit: list[tuple[int, PhaseOption]]) -> float | None:
    """The least cap at which a class of these rollouts has a layout (None: not even at its members'
    least cap): its busiest node's time, searched over the layouts."""
    opts = [o for _, o in unit]
    cap = group_cap(builder.cap[j] for j, _ in unit)
    mem = builder.topo.clusters[opts[0].cluster].host_mem_gb
    first = class_layout(opts, cap, mem)
    if first is None:
        return None
    width = max(o.nodes for o in opts)
    users: list[list[PhaseOption]] = [[] for _ in range(width)]
    for o, f in zip(opts, first):
        for n in range(f, f + o.nodes):
            users[n].append(o)
    return max(sum(load_s(o, len(u) > 1) for o in u) for u in users)


class Packing:
    """Items into bins of at most ``k`` jobs on one key, every job in one bin: the set-partitioning
    LP by column generation (its bound), and an integer partition over the bins it generated. An
    item's pieces are its alternatives (options, or ways to cover its jobs); pieces that share a
    job never share a bin."""

    def __init__(self, kind: str, pieces: dict[int, list[Piece]], cap: dict[int, float], builder: CandidateBuilder):
        self.kind = kind
        self.k = builder.k
        self.pieces = pieces
        self.items = list(pieces)
        self.rows = sorted({j for ps in pieces.values() for p in ps for j in p.covers})
        self.cap = cap
        self.node_mem = {c: spec.host_mem_gb for c, spec in builder.topo.clusters.items()}
        self.price = builder.price
        prices = {self.price[p.cluster] for ps in pieces.values() for p in ps}
        own = any(p.cost for ps in pieces.values() for p in ps)
        self.unit = prices.pop() if len(prices) == 1 and not own else None  # every bin costs a multiple of it
        # A bin's leader is its item of smallest (cap, index).
        self.rank = {i: r for r, i in enumerate(sorted(self.items, key=lambda i: (cap[i], i)))}
        self.by_key: dict[tuple, list[Piece]] = {}
        for ps in pieces.values():
            for p in ps:
                self.by_key.setdefault(p.key, []).append(p)
        self.bins: list[tuple[tuple[Piece, ...], float]] = []  # every bin generated, with its cost
        self.dual: dict[int, float] = {}  # each row's dual at the last LP solved
        self.options: dict[Piece, PhaseOption] = {}  # the phase option of each piece (set by ``half``)
        self._order: dict[tuple, tuple] = {}

    # ----- the LP ---------------------------------------------------------------------------
    def solve(self, deadline: float) -> HalfBound:
        solver = pywraplp.Solver.CreateSolver("GLOP")
        cover = {j: solver.Constraint(1, 1, f"job{j}") for j in self.rows}
        objective = solver.Objective()
        objective.SetMinimization()
        seen: set = set()

        def add(members: tuple, cost: float) -> None:
            if members in seen:
                return
            seen.add(members)
            var = solver.NumVar(0, solver.infinity(), f"b{len(self.bins)}")
            for p in members:
                for j in p.covers:
                    cover[j].SetCoefficient(var, 1)
            objective.SetCoefficient(var, cost)
            self.bins.append((members, cost))

        for i in self.items:  # every piece alone: always a bin
            for p in self.pieces[i]:
                add((p,), self.price[p.cluster] * p.nodes + p.cost)
        best, value, proven, rounds = 0.0, 0.0, False, 0
        while time.perf_counter() < deadline and solve_lp(solver, deadline):
            rounds += 1
            value = objective.Value()
            dual = self.dual = {j: row.dual_value() for j, row in cover.items()}
            found, leaders = self._price(dual, deadline)
            if leaders is None:  # out of time: no bound from this round
                break
            best = max(best, value + sum(min(0.0, rc) for rc in leaders.values()))
            if not found:
                proven = True
                best = max(best, value)
                break
            for members, cost in found:
                add(members, cost)
        if self.unit is not None and best > 0:
            best = self.unit * math.ceil(best / self.unit - 1e-6)
        return HalfBound(self.kind, best, value, proven, len(self.bins), rounds)

    def integer(self, time_limit_s: float, threads: int = 1, tiebreak=None,
                target: float | None = None) -> list[tuple[tuple[Piece, ...], float]] | None:
        """The cheapest partition of the items into the bins generated so far (CP-SAT); it stops
        at a plan of cost ``target`` (the LP's bound: no cheaper one exists)."""
        cp = cp_model.CpModel()
        x = [cp.new_bool_var(f"b{b}") for b in range(len(self.bins))]
        rows: dict[int, list] = {j: [] for j in self.rows}
        for var, (members, _) in zip(x, self.bins):
            for p in members:
                for j in p.covers:
                    rows[j].append(var)
        for vars_ in rows.values():
            cp.add_exactly_one(vars_)
        tb = [0] * len(self.bins) if tiebreak is None else [tiebreak(m) for m, _ in self.bins]
        scale = 100 * (1 if tiebreak is None else 1000)
        cp.minimize(sum((int(round(cost * scale)) + t) * var for var, t, (_, cost) in zip(x, tb, self.bins)))
        sat = cp_model.CpSolver()
        sat.parameters.max_time_in_seconds = max(0.05, time_limit_s)
        sat.parameters.num_workers = max(1, threads)
        stop = _StopAt(target * scale + sum(tb) + 0.5) if target is not None else None
        if sat.solve(cp, stop) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        return [self.bins[b] for b, var in enumerate(x) if sat.value(var)]

    # ----- pricing ---------------------------------------------------------------------------
    def _price(self, dual: dict[int, float], deadline: float) -> tuple[list[tuple[tuple, float]], dict | None]:
        """Bins of negative reduced cost (each leader's improving ones, best last), and each
        leader's least reduced cost; None when out of time."""
        found: list[tuple[tuple, float]] = []
        leaders: dict[int, float] = {}
        for key in self.by_key:
            order, covers, sizes, needs = self._ordered(key)
            worth = [sum(dual[j] for j in c) - p.cost for p, c in zip(order, covers)]
            for li, lead in enumerate(order):
                if time.perf_counter() >= deadline:
                    return found, None
                rc = self._lead(li, order, worth, covers, sizes, needs, found)
                leaders[lead.item] = min(rc, leaders.get(lead.item, rc))
        return found, leaders

    def _ordered(self, key: tuple) -> tuple:
        """A key's pieces by leader rank, with their jobs, sizes and needs (once: the search reads
        them for every leader, and dataclass attributes are slow to read in bulk)."""
        if key not in self._order:
            order = sorted(self.by_key[key], key=lambda p: self.rank[p.item])
            self._order[key] = (order, [frozenset(p.covers) for p in order], [p.size for p in order],
                                [p.need_s for p in order])
        return self._order[key]

    def _lead(self, li: int, order: list[Piece], worth: list[float], covers: list[frozenset], sizes: list[int],
              needs: list[float], found: list) -> float:
        """The least reduced cost of a bin led by ``order[li]`` (its item alone included), the
        members from the pieces after it; ``worth``: each piece's duals less its own cost."""
        lead = order[li]
        cap = self.cap[lead.item]
        price = self.price[lead.cluster]
        mem_cap = self.node_mem[lead.cluster]
        own = covers[li]
        least = price * lead.nodes - worth[li]  # the leader alone
        # Members of no value never lower a bin's reduced cost (removing one keeps it feasible).
        room0 = self.k - lead.size
        limit = cap + TOL
        at = [i for i in range(li + 1, len(order)) if worth[i] > EPS and needs[i] <= limit and sizes[i] <= room0
              and own.isdisjoint(covers[i])]
        if not at or needs[li] > limit:
            return least
        at.sort(key=lambda i: -worth[i])
        cands = [order[i] for i in at]
        widest = max([lead.nodes] + [p.nodes for p in cands])
        n = len(cands)
        values = [worth[i] for i in at]
        busy = [p.busy_s * p.nodes for p in cands]
        mem = [p.mem_gb * p.nodes for p in cands]
        size = [sizes[i] for i in at]
        width_of = [p.nodes for p in cands]
        covers_of = [covers[i] for i in at]
        # Pieces sharing a job (an item's options, a class and its members alone) never share a bin.
        twins = len({j for c in covers_of for j in c}) < sum(len(c) for c in covers_of)
        # prefix sums of the values in decreasing order: the best r from position i on sum to
        # prefix[i + r] - prefix[i] (every item holds a job or more, and twins overcount: an upper bound).
        prefix = [0.0]
        for v in values:
            prefix.append(prefix[-1] + v)
        best_net = -least  # a bin beats the leader alone when its net gain exceeds this
        best_bin = None
        limit_area = widest * cap + TOL
        limit_mem = widest * mem_cap
        area_cap = cap + TOL

        def visit(start: int, members: list[int], taken: set, room: int, gain: float, area: float,
                  used_mem: float, width: int) -> None:
            nonlocal best_net, best_bin
            for i in range(start, n):
                if size[i] > room or (twins and not taken.isdisjoint(covers_of[i])):
                    continue
                a2, m2 = area + busy[i], used_mem + mem[i]
                if a2 > limit_area or m2 > limit_mem:
                    continue
                # With i and the room - 1 best after it: values decrease and the width only
                # grows, so once this cannot beat the best, no later i can either.
                upper = gain + prefix[i + room if i + room < n else n] - prefix[i]
                if upper - price * width <= best_net + EPS:
                    break
                g2 = gain + values[i]
                w2 = width if width >= width_of[i] else width_of[i]
                if upper - price * w2 <= best_net + EPS:
                    continue
                members.append(i)
                if a2 <= w2 * area_cap and m2 <= w2 * mem_cap:
                    net = g2 - price * w2
                    if net > best_net + EPS:  # the leader's best so far: a column
                        best_net, best_bin = net, list(members)
                        if net > EPS:
                            chosen = [cands[x] for x in members]
                            found.append((self._bin(lead, chosen),
                                          price * w2 + lead.cost + sum(p.cost for p in chosen)))
                if room > size[i]:
                    visit(i + 1, members, taken | covers_of[i] if twins else taken, room - size[i], g2, a2, m2, w2)
                members.pop()

        visit(0, [], own, room0, worth[li], lead.busy_s * lead.nodes,
              lead.mem_gb * lead.nodes, lead.nodes)
        return min(least, -best_net) if best_bin is not None else least

    @staticmethod
    def _bin(lead: Piece, members: list[Piece]) -> tuple:
        return tuple(sorted([lead] + members, key=lambda p: (p.item, p.key, p.nodes)))


class _StopAt(cp_model.CpSolverSolutionCallback):
    def __init__(self, objective: float):
        super().__init__()
        self.objective = objective

    def on_solution_callback(self) -> None:
        if self.ObjectiveValue() <= self.objective:
            self.StopSearch()
