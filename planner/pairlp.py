"""The joint LP where a rollout node holds one job or two: a lower bound tighter than the halves'.

Where every job has one training and one rollout option of one node each (planner/regroup.py's
``eligible``), phases sit on disjoint clusters and no three rollouts ever fit one node (300 RH
jobs), a group is a set of at most ``k`` jobs on one training node plus one rollout node per job,
less one per pair of jobs sharing a node: it costs ``price_T + sum(price_R) - price_R * pairs``.
The candidate rules of planner/optimal.py reduce to: one training option; ``cap`` = the least
member's ``slo * solo``; each member's floor (its loop, its train, its rollout) within ``cap``;
when shared, trains plus warm switches within ``cap`` and their host memory within a node's; a
pair's rollouts plus warm switches within ``cap`` and their memory within a node's.

The LP over all such groups (set partitioning, each job once) is the one column generation over
candidate groups solves (planner/colgen.py), but this pricing knows the structure. Per *leader*
(a group's member of least ``(cap, index)``), with duals ``pi``: a member alone is worth
``v = pi - price_R``, a pair ``pi_a + pi_b - price_R``. A depth-first search over the possible
members stops once no completion can beat the best group found, by the least of two bounds: each
member's *share* (its value alone, or half of its best pair's), and the members' best values alone
plus a rollout node saved per two members; how many more members fit is bounded by the least train
times and memories left. A group is a column when its reduced cost is below 0 (ties within
``GAIN``), so at any duals ``sum(pi) + sum over leaders of min(0, least reduced cost)`` is a lower
bound (each job leads one group at most: the Lagrangian bound of planner/pricing.py).

Column generation starts from the training half's bins (each with its best pairs) and runs quick
rounds first (each leader's search cut short) while the LP falls fast. Then exact rounds price at a
mix of a stability centre and the LP's duals (Wentges smoothing); the centre starts at the halves'
duals (planner/halves.py: dual feasible here, a group being a training bin plus rollout bins, and
their sum is the halves' bound) and moves to any point of higher Lagrangian bound. With two
threads a forked process prices every other leader.

Measured on 300 RH jobs (s3, two processes): quick rounds take the LP from $5,833 to $5,456 in
3 s, exact rounds take 1-1.5 s each, and the bound passes the halves' $5,369 (before rounding to
whole nodes) after 4 s: $5,406 at 5 s, $5,430 at 8 s, $5,448 after 19 s in one process beside
the regrouping (LP $5,451). The general pricing (planner/pricing.py) had the LP at $5,594 after
12 s and $5,468 after 110 s, never proving a bound. On 100 RH jobs it settles in under a second.
"""

from __future__ import annotations

import bisect
import math
import multiprocessing
import time
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp

from weave_rl.planner.halves import half, phases_apart, solve_lp
from weave_rl.planner.rules import TIME_TOL as TOL, load_s
from weave_rl.planner.optimal import CandidateBuilder
from weave_rl.planner.regroup import eligible

EPS = 1e-7  # reduced costs
GAIN = 1e-6  # $/h: a group must beat the best so far by this much (ties are legion at the LP's duals)
SMOOTHING = 0.7  # weight of the stability centre in the duals priced
COLUMNS_PER_LEADER = 3  # the last groups each leader's search improved on (its best included)
QUICK_NODES = 200  # groups a leader's search may try in a quick round
QUICK_DROP = 0.001  # quick rounds go on while the LP falls by more than this share a round
PARALLEL_JOBS = 150  # from this many jobs, a second process prices half the leaders


@dataclass(frozen=True)
class PairGroup:
    """A group: its jobs (sorted) and its pairs (jobs sharing a rollout node)."""

    jobs: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]
    cost: float


@dataclass
class PairBound:
    bound: float  # no plan costs less (0 when none was proved)
    lp_value: float
    proven: bool  # the LP was solved to optimality
    rounds: int
    columns: int
    duals: dict[int, float] | None = None  # per job, the duals the bound is the Lagrangian bound at


class JointLP:
    """The halves' LPs, then the LP by pairs: in a forked process while the caller goes on (its
    latest bound read when wanted), or here. The bound is the best of them by whole nodes
    (``by_whole_nodes``)."""

    def __init__(self, builder: CandidateBuilder, halves_deadline: float):
        self.b = builder
        self.rollout_packing = half(builder, "rollout")
        self.rollout = self.rollout_packing.solve(halves_deadline)
        train = half(builder, "train")
        self.train = train.solve(halves_deadline)
        self.center = None  # the halves' duals: dual feasible for the LP by pairs when both are optimal
        if self.rollout.proven and self.train.proven:
            self.center = {j: self.rollout_packing.dual[j] + train.dual[j] for j in builder.job_ids}
        self.seeds = [[p.item for p in members] for members, _ in train.bins if len(members) > 1]
        self.pair: PairBound | None = None  # the latest
        self._process = None
        self._reader = None

    def start(self, deadline: float, background: bool) -> None:
        """Solves the LP by pairs until ``deadline``, in a forked process when ``background`` (and
        fork is available), else here and now."""
        lp = PairLP(self.b)
        if background:
            try:
                context = multiprocessing.get_context("fork")
                self._reader, writer = context.Pipe(duplex=False)
                self._process = context.Process(target=_in_background, daemon=True,
                                                args=(lp, deadline, self.center, self.seeds, writer))
                self._process.start()
                writer.close()
                return
            except (ValueError, OSError):  # no fork here
                self._process = self._reader = None
        self.pair = lp.solve(deadline, self.center, self.seeds)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def settled(self, until: float) -> bool:
        """Whether the LP is proven optimal, waiting for that until ``until``."""
        while self._reader is not None and not (self.pair and self.pair.proven):
            if not self._reader.poll(max(0.0, until - time.perf_counter())):
                break
            self._read()
        return bool(self.pair and self.pair.proven)

    def bound(self) -> float:
        """The best bound so far (what the process has sent), by whole nodes."""
        while self._reader is not None and self._reader.poll(0):
            self._read()
        joint = self.pair.bound if self.pair else 0.0
        return by_whole_nodes(self.b, joint, self.train.bound, self.rollout.bound)

    def close(self) -> None:
        if self._process is not None:
            self.bound()  # the last reports first
            self._process.terminate()
            self._process.join()
            self._process = self._reader = None

    def _read(self) -> None:
        try:
            self.pair = self._reader.recv()
        except (EOFError, OSError):  # the process has ended
            self._reader = None


def _in_background(lp: "PairLP", deadline: float, center, seeds, writer) -> None:
    """The forked process: every round's bound goes to the caller."""
    lp.solve(deadline, center, seeds, report=writer.send)
    writer.close()


def single_prices(builder: CandidateBuilder) -> tuple[float, float] | None:
    """The one price of every training option's node and of every rollout option's, if so."""
    train = {builder.price[t.cluster] for j in builder.job_ids for t in builder.train_opts[j]}
    rollout = {builder.price[r.cluster] for j in builder.job_ids for r in builder.rollout_opts[j]}
    return (train.pop(), rollout.pop()) if len(train) == 1 and len(rollout) == 1 else None


def whole_nodes(joint: float, train: float, rollout: float, price_t: float, price_r: float) -> float:
    """The least cost of whole nodes that meets all three bounds: with one training price and one
    rollout price (and one training node per group), a plan costs ``price_t * G + price_r * R``
    for its G groups and R rollout nodes, its training nodes cost at least the training half's
    bound, its rollout nodes the rollout half's, and the whole at least ``joint``."""
    least_g = math.ceil(train / price_t - 1e-6)
    least_r = math.ceil(rollout / price_r - 1e-6)
    best = math.inf
    for g in range(least_g, least_g + 100_000):
        if price_t * g + price_r * least_r >= best:
            break  # more training nodes only cost more from here
        r = max(least_r, math.ceil((joint - price_t * g) / price_r - 1e-6))
        best = min(best, price_t * g + price_r * r)
    return round(best, 6)


def by_whole_nodes(builder: CandidateBuilder, joint: float, train: float, rollout: float) -> float:
    """``whole_nodes`` where every option's node has one price per phase, else the best of the
    joint bound and the halves' sum."""
    prices = single_prices(builder)
    if prices is None or not eligible(builder):
        return max(joint, train + rollout)
    return whole_nodes(joint, train, rollout, *prices)


def applies(builder: CandidateBuilder) -> bool:
    """One-node single options, phases apart, and no three rollouts fit one node."""
    if not builder.job_ids or not eligible(builder) or not phases_apart(builder):
        return False
    return not _three_fit(builder)


def _three_fit(builder: CandidateBuilder) -> bool:
    """Whether some three jobs' rollouts (with warm switches) fit within the least cap of the three,
    on one cluster: for each job as the one of least cap, its load plus the two least loads of the
    jobs of larger cap."""
    by_cluster: dict[str, list[tuple[float, float]]] = {}
    for j in builder.job_ids:
        r = builder.rollout_opts[j][0]
        by_cluster.setdefault(r.cluster, []).append((builder.cap[j], load_s(r, True)))
    for jobs in by_cluster.values():
        jobs.sort(key=lambda x: -x[0])  # by cap, largest first
        least = [math.inf, math.inf]  # the two least loads among jobs of larger cap
        for cap, load in jobs:
            if load + least[0] + least[1] <= cap + TOL:
                return True
            if load < least[1]:
                least = sorted([least[0], load])
    return False


class PairLP:
    """The joint LP's data, its exact pricing and its column generation."""

    def __init__(self, builder: CandidateBuilder):
        self.b = builder
        self.k = builder.k
        ids = builder.job_ids
        self.order = sorted(ids, key=lambda j: (builder.cap[j], j))  # leader order
        n = len(self.order)
        self.pos = {j: i for i, j in enumerate(self.order)}
        train = [builder.train_opts[j][0] for j in self.order]
        roll = [builder.rollout_opts[j][0] for j in self.order]
        node_mem = {c: spec.host_mem_gb for c, spec in builder.topo.clusters.items()}
        self.cap = np.array([builder.cap[j] for j in self.order])
        self.floor = np.array([max(builder.loop_s(j, t, r), t.duration_s, r.duration_s)
                               for j, t, r in zip(self.order, train, roll)])
        self.tau = [load_s(t, True) for t in train]
        self.tmem = [t.host_mem_gb for t in train]
        self.tkey = [(t.gpu_type, t.cluster, t.gpus) for t in train]
        self.t_mem_cap = [node_mem[t.cluster] for t in train]
        self.price_t = [builder.price[t.cluster] for t in train]
        self.price_r = np.array([builder.price[r.cluster] for r in roll])
        load = np.array([load_s(r, True) for r in roll])
        rmem = np.array([r.host_mem_gb for r in roll])
        rcluster = np.array([r.cluster for r in roll])
        r_mem_cap = np.array([node_mem[r.cluster] for r in roll])
        # A pair's least cap: its loads summed (inf where they may never share a node).
        need = load[:, None] + load[None, :]
        never = (rcluster[:, None] != rcluster[None, :]) | (rmem[:, None] + rmem[None, :] > r_mem_cap[:, None])
        need[never] = math.inf
        np.fill_diagonal(need, math.inf)
        self.need = need
        # Each leader's possible members (after it in leader order, same training option, floor
        # within its cap) and which of them have a partner under its cap.
        self.members: list[np.ndarray] = []
        self.partnered: list[np.ndarray] = []
        for i in range(n):
            after = np.arange(i + 1, n)
            same = np.array([self.tkey[x] == self.tkey[i] for x in after], dtype=bool)
            m = after[same & (self.floor[after] <= self.cap[i] + TOL)] if len(after) else after
            self.members.append(m)
            group = np.concatenate(([i], m))
            fits = self.need[np.ix_(group, group)] <= self.cap[i] + TOL
            self.partnered.append(fits[1:].any(axis=1))
        self.columns: list[PairGroup] = []
        self._pool = None  # a forked worker process that prices half the leaders

    # ----- groups -------------------------------------------------------------------------------
    def group(self, positions: list[int]) -> PairGroup:
        """The group of these jobs (leader-order positions) with its most pairs."""
        positions = sorted(positions)
        cap = self.cap[positions[0]]
        _, pairs = _best_pairs(positions, lambda a, b: self.need[a, b] <= cap + TOL, self.price_r.tolist())
        cost = self.price_t[positions[0]] + float(self.price_r[positions].sum()) \
            - sum(float(self.price_r[a]) for a, _ in pairs)
        return PairGroup(tuple(sorted(self.order[x] for x in positions)),
                         tuple(tuple(sorted((self.order[a], self.order[b]))) for a, b in pairs), round(cost, 6))

    def fits(self, positions: list[int]) -> bool:
        """The candidate rules on a set of jobs (leader-order positions)."""
        positions = sorted(positions)
        lead = positions[0]
        if len(positions) > self.k or any(self.tkey[x] != self.tkey[lead] for x in positions):
            return False
        if any(self.floor[x] > self.cap[lead] + TOL for x in positions):
            return False
        if len(positions) > 1 and (sum(self.tau[x] for x in positions) > self.cap[lead] + TOL
                                   or sum(self.tmem[x] for x in positions) > self.t_mem_cap[lead]):
            return False
        return True

    # ----- pricing --------------------------------------------------------------------------------
    def price(self, dual: np.ndarray, deadline: float, nodes: int | None = None) -> tuple[list[PairGroup], float | None]:
        """Each leader's best groups when their reduced cost is below 0, and the Lagrangian bound
        at these duals (leader-order array); None when out of time, or when some leader's search
        went past ``nodes`` groups (then its best groups so far are returned). With a worker
        process, it searches every other leader."""
        leaders = list(range(len(self.order)))
        if self._pool is not None:
            other = self._pool.apply_async(_search_part, ((dual, leaders[1::2], deadline, nodes),))
            results = self.search(dual, leaders[0::2], deadline, nodes)
            theirs = other.get()
            results = None if results is None or theirs is None else results + theirs
        else:
            results = self.search(dual, leaders, deadline, nodes)
        if results is None:
            return [], None
        found: list[PairGroup] = []
        total: float | None = float(dual.sum())
        for i, best, chosen, complete in results:
            found += [self.group([i] + c) for c in chosen[-COLUMNS_PER_LEADER:]]
            if not complete:
                total = None
            if total is not None:
                total += min(0.0, self.price_t[i] - best) - GAIN  # a group missed beats the best by less
        return found, total

    def search(self, dual: np.ndarray, leaders: list[int], deadline: float,
               nodes: int | None) -> list[tuple[int, float, list[list[int]], bool]] | None:
        """For each leader: its best value, its improving groups, and whether the search was
        complete; None when out of time."""
        value = dual - self.price_r
        out = []
        for i in leaders:
            if time.perf_counter() >= deadline:
                return None
            out.append((i, *self._lead(i, dual, value, nodes)))
        return out

    def _lead(self, i: int, dual: np.ndarray, value: np.ndarray,
              nodes: int | None = None) -> tuple[float, list[list[int]], bool]:
        """The best value (duals less rollout nodes) of a group led by ``i``, the other members of
        each group that beat the best before it and the training node's price (best last), and
        whether the search was complete (it stops after ``nodes`` groups)."""
        alone = float(value[i])
        best = max(alone, self.price_t[i])  # only a group of negative reduced cost is a column
        m = self.members[i]
        room = self.k - 1
        if not len(m) or room <= 0:
            return alone, [], True
        # A member of no worth is never needed: alone it adds ``value``, paired ``dual``.
        partnered = self.partnered[i]
        keep = np.where(partnered, dual[m] > EPS, value[m] > EPS)
        m = m[keep]
        if not len(m):
            return alone, [], True
        # Each member's share of its best pair (half the pair's value) or its value alone: a group's
        # value is at most its members' shares.
        pool = np.concatenate(([i], m))
        fits = self.need[np.ix_(pool, pool)] <= self.cap[i] + TOL
        pair_value = np.where(fits, dual[pool][:, None] + dual[pool][None, :] - self.price_r[pool][:, None], -math.inf)
        share = np.maximum(value[pool], pair_value.max(axis=1) / 2)
        lead_worth, worth = float(share[0]), share[1:]
        by = np.argsort(-worth, kind="stable")
        m, worth = m[by], worth[by]
        top = np.concatenate(([0.0], np.cumsum(np.maximum(worth, 0.0))))
        if lead_worth + top[min(room, len(m))] <= best + GAIN:
            return alone, [], True
        members, worth_l, top_l = m.tolist(), worth.tolist(), top.tolist()
        n = len(members)
        cap = float(self.cap[i]) + TOL
        mem_cap = self.t_mem_cap[i]
        need, tau, tmem, val, price_r = self.need, self.tau, self.tmem, value.tolist(), self.price_r.tolist()
        chosen: list[list[int]] = []  # each group that beat the best before it, best last
        group = [i]
        # How many more members fit at most, by their least train times and memories.
        tau_least = np.concatenate(([0.0], np.cumsum(np.sort(np.array(tau)[m])))).tolist()
        mem_least = np.concatenate(([0.0], np.cumsum(np.sort(np.array(tmem)[m])))).tolist()
        # Or: the members' values alone, the best ones, plus a rollout node saved per two members.
        value_top = np.concatenate(([0.0], np.cumsum(np.maximum(np.sort(value[m])[::-1], 0.0)))).tolist()
        most_saved = float(self.price_r[group + members].max())

        def matched(g: list[int]) -> float:
            """The rollout nodes saved by the best pairs among ``g``."""
            return _pair_value(g, lambda a, b: need[a, b] <= cap, price_r)

        left = [nodes if nodes is not None else -1]

        def visit(first: int, room: int, worth_sum: float, base: float, busy: float, mem: float) -> None:
            nonlocal best
            more = min(room, bisect.bisect_right(tau_least, cap - busy) - 1,
                       bisect.bisect_right(mem_least, mem_cap - mem) - 1)
            if base + value_top[more] + most_saved * ((len(group) + more) // 2) <= best + GAIN:
                return
            for x in range(first, n):
                upper = worth_sum + top_l[min(x + more, n)] - top_l[x]
                if upper <= best + GAIN:
                    return  # worth decreases along the members: no later one does better
                j = members[x]
                b2, m2 = busy + tau[j], mem + tmem[j]
                if b2 > cap or m2 > mem_cap:
                    continue
                if left[0] == 0:
                    return
                left[0] -= 1
                group.append(j)
                total = base + val[j]
                if total + most_saved * (len(group) // 2) > best + GAIN:
                    score = total + matched(group)
                    if score > best + GAIN:
                        best = score
                        chosen.append(group[1:])
                if room > 1:
                    visit(x + 1, room - 1, worth_sum + worth_l[x], total, b2, m2)
                group.pop()

        visit(0, room, lead_worth, alone, self.tau[i], self.tmem[i])
        return best, chosen, left[0] != 0

    # ----- column generation --------------------------------------------------------------------
    def solve(self, deadline: float, center: dict[int, float] | None = None,
              seeds: list[list[int]] = (), progress=None, threads: int = 1, report=None) -> PairBound:
        """The LP's bound by column generation until ``deadline``; ``center``: dual-feasible duals
        per job (the halves'), ``seeds``: job sets whose best groups start the master (each is
        checked against the candidate rules); with ``threads`` > 1, a forked process prices
        half the leaders; ``report`` gets the bound after every exact round."""
        if threads > 1 and len(self.order) >= PARALLEL_JOBS:
            try:
                _SHARED["lp"] = self
                self._pool = multiprocessing.get_context("fork").Pool(1)
            except (ValueError, OSError):  # no fork here: one process
                self._pool = None
        try:
            return self._generate(deadline, center, seeds, progress, report)
        finally:
            if self._pool is not None:
                self._pool.terminate()
                self._pool = None
            _SHARED.clear()

    def _generate(self, deadline: float, center: dict[int, float] | None, seeds, progress, report) -> PairBound:
        solver = pywraplp.Solver.CreateSolver("GLOP")
        n = len(self.order)
        cover = [solver.Constraint(1, 1, f"job{x}") for x in range(n)]
        objective = solver.Objective()
        objective.SetMinimization()
        seen: set[tuple] = set()

        def add(g: PairGroup) -> None:
            if g.jobs in seen:
                return
            seen.add(g.jobs)
            var = solver.NumVar(0, solver.infinity(), "")
            for j in g.jobs:
                cover[self.pos[j]].SetCoefficient(var, 1)
            objective.SetCoefficient(var, g.cost)
            self.columns.append(g)

        for x in range(n):
            add(self.group([x]))
        for jobs in seeds:
            positions = [self.pos[j] for j in jobs]
            if self.fits(positions):
                add(self.group(positions))
        centre = None if center is None else np.array([center[j] for j in self.order])
        bound = float(centre.sum()) if centre is not None else 0.0

        def result() -> PairBound:  # the bound with the duals it holds at (planner/optimize.py's colocation needs them)
            duals = None if centre is None else {j: float(centre[x]) for x, j in enumerate(self.order)}
            return PairBound(bound, value, proven, rounds, len(self.columns), duals)

        value, proven, rounds, quick, before = 0.0, False, 0, True, math.inf
        while time.perf_counter() < deadline and solve_lp(solver, deadline):
            rounds += 1
            value = objective.Value()
            lp_dual = np.array([row.dual_value() for row in cover])
            # First quick rounds (each leader's search cut short) while the LP falls fast.
            quick = quick and value < before * (1 - QUICK_DROP)
            before = value
            if quick:
                found, _ = self.price(lp_dual, deadline, QUICK_NODES)
                if progress:
                    progress(f"pair LP {rounds}: LP ${value:,.2f}, +{len(found)} columns (quick)")
                if found:
                    for g in found:
                        add(g)
                    continue
                quick = False
            alpha = SMOOTHING if centre is not None else 0.0
            while True:
                dual = alpha * centre + (1 - alpha) * lp_dual if alpha else lp_dual
                found, lagrangian = self.price(dual, deadline)
                if lagrangian is None:
                    break
                if lagrangian > bound:
                    bound, centre = lagrangian, dual
                # Columns that improve the restricted LP; none at a smoothed point: price nearer it.
                improving = [g for g in found if g.cost - sum(lp_dual[self.pos[j]] for j in g.jobs) < -EPS]
                if improving or not alpha:
                    break
                alpha = 0.0 if alpha < 0.1 else alpha / 2
            if progress:
                progress(f"pair LP {rounds}: LP ${value:,.2f}, bound ${bound:,.2f}, +{len(found)} columns")
            if lagrangian is None:
                break
            # Priced at the LP's own duals, none improves: the LP is optimal (the bound is its
            # value, less what ``GAIN`` may hide).
            proven = not found
            if report:
                report(result())
            if proven:
                break
            for g in improving or found:
                add(g)
        return result()


_SHARED: dict = {}  # the LP, inherited by the forked worker


def _search_part(args):
    return _SHARED["lp"].search(*args)


def _pair_value(group: list[int], fit, price_r: list[float]) -> float:
    """The most rollout cost saved by disjoint pairs among ``group`` (at most five jobs: searched)."""
    best = 0.0
    for a in range(len(group)):
        for b in range(a + 1, len(group)):
            if fit(group[a], group[b]):
                rest = [x for y, x in enumerate(group) if y != a and y != b]
                best = max(best, price_r[group[a]] + _pair_value(rest, fit, price_r))
    return best


def _best_pairs(group: list[int], fit, price_r: list[float]) -> tuple[float, list[tuple[int, int]]]:
    """The disjoint pairs among ``group`` that save the most rollout cost, and what they save."""
    best: tuple[float, list[tuple[int, int]]] = (0.0, [])
    for a in range(len(group)):
        for b in range(a + 1, len(group)):
            if fit(group[a], group[b]):
                rest = [x for y, x in enumerate(group) if y != a and y != b]
                saved, pairs = _best_pairs(rest, fit, price_r)
                if saved + price_r[group[a]] > best[0] + EPS:
                    best = (saved + price_r[group[a]], [(group[a], group[b])] + pairs)
    return best
