"""Set partitioning over co-execution groups at scale: column generation for the bound, an integer
master over the generated columns for the plan.

Master (every job covered once or rejected; nodes per cluster within the topology)::

    min  sum_G (cost_G + extra_G) x_G + M sum_j r_j
    s.t. sum_{G ∋ j} x_G + r_j = 1          (pi_j)      for every job j
         sum_G nodes_c(G) x_G <= N_c        (mu_c <= 0) for every cluster c

``M`` (the topology's whole $/h plus one) makes placing one more job worth more than any saving,
so the master places as many jobs as it can and then minimises cost.

- The LP relaxation is solved with GLOP (OR-Tools), columns added in place.
- Pricing: a greedy heuristic here while it finds columns, then the exact search of
  planner/pricing.py, which also proves a bound on the most negative reduced cost ``rc_lb``.
- Lower bound (Lagrangian, valid at every proven pricing): ``LP + K * min(0, rc_lb)``, ``K`` an upper
  bound on the number of groups of an optimal plan; it equals the LP optimum once pricing proves
  that no column improves.
- The integer master over the generated columns: CP-SAT, or CBC through PuLP.
"""

from __future__ import annotations

import math
import random
import time
import warnings
from dataclasses import dataclass
from typing import Iterable, Mapping

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from weave_rl.planner.columns import OBJECTIVE_SCALE, Column, Incumbent, objective_units
from weave_rl.planner.optimal import Candidate, CandidateBuilder, make_candidate
from weave_rl.planner.rules import TIME_TOL, fits_cap, fits_memory, load_s
from weave_rl.topology.topology import Topology

EPS = 1e-6


def reject_penalty(topo: Topology) -> float:
    return round(topo.cost_usd_per_hour() + 1.0, 2)


def max_groups(topo: Topology, n_jobs: int, incumbent: float | None = None) -> int:
    """Groups in an optimal plan: at most one per job; every group holds a training pool and rollout
    nodes apart from it (two nodes or more); and the plan costs no more than the incumbent."""
    k = min(n_jobs, sum(c.nodes for c in topo.clusters.values()) // 2)
    cheapest = 2 * min(topo.cluster_node_usd_per_hour().values())
    if incumbent is not None and cheapest > 0:
        k = min(k, int(incumbent // cheapest))
    return max(1, k)


class LpTrouble(RuntimeError):
    """GLOP could not solve the LP master (numerical trouble)."""


# ----- LP master -----------------------------------------------------------------------------
class LpMaster:
    def __init__(self, job_ids: list[int], topo: Topology, penalty: float):
        self.job_ids, self.topo, self.penalty = job_ids, topo, penalty
        self.nodes = {c: spec.nodes for c, spec in topo.clusters.items()}
        self.columns: list[Column] = []
        self.last_x: list[float] = []  # the dive's last LP solution
        self.closed: set[int] = set()  # columns held at zero (``close``)
        self._build()

    def _build(self, lenient: bool = False) -> None:
        fixed = [i for i, var in enumerate(getattr(self, "vars", [])) if var.lb() > 0]  # the dive's fixings stay
        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        if lenient:
            # GLOP may finish and still call its answer imprecise when the cost perturbation it
            # needed looks large against the costs (the rejection penalty dwarfs a group's cost):
            # seen on 300 RH jobs mid-dive, where HiGHS agreed with its value to 1e-6.
            self.solver.SetSolverSpecificParametersAsString("change_status_to_imprecise: false")
        self.cover = {j: self.solver.Constraint(1, 1, f"job{j}") for j in self.job_ids}
        self.capacity = {c: self.solver.Constraint(-self.solver.infinity(), n, f"nodes.{c}")
                         for c, n in self.nodes.items()}
        self.objective = self.solver.Objective()
        self.objective.SetMinimization()
        self.vars: list = []
        for j in self.job_ids:
            # No upper bound on rejection: its dual would enter the Lagrangian bound.
            r = self.solver.NumVar(0, self.solver.infinity(), f"reject{j}")
            self.cover[j].SetCoefficient(r, 1)
            self.objective.SetCoefficient(r, self.penalty)
        columns, self.columns = self.columns, []
        for column in columns:
            self.add(column)
        for i in fixed:
            self.vars[i].SetLb(1)
        self.close(self.closed)

    def close(self, indices) -> None:
        """Hold these columns at zero from now on (dives and roundings may not use them)."""
        for i in indices:
            self.vars[i].SetUb(0)
        self.closed |= set(indices)

    def add(self, column: Column) -> None:
        self.columns.append(column)
        var = self.solver.NumVar(0, self.solver.infinity(), f"x{len(self.vars)}")
        for j in column.jobs:
            self.cover[j].SetCoefficient(var, 1)
        for c, n in column.nodes:
            self.capacity[c].SetCoefficient(var, n)
        self.objective.SetCoefficient(var, column.objective)
        self.vars.append(var)

    def solve(self, deadline: float | None = None) -> tuple[float, dict[int, float], dict[str, float]]:
        """Optimal value and duals; ``LpTrouble`` when GLOP fails twice (or runs past ``deadline``)."""
        status = self._solve(deadline)
        if status != pywraplp.Solver.OPTIMAL and deadline is not None and time.perf_counter() >= deadline:
            raise LpTrouble("LP master out of time")
        if status != pywraplp.Solver.OPTIMAL:  # numerical trouble after many incremental changes:
            self._build(lenient=True)  # the same LP, built afresh
            status = self._solve(deadline)
        if status != pywraplp.Solver.OPTIMAL:
            raise LpTrouble(f"LP master not optimal (GLOP status {status})")
        pi = {j: row.dual_value() for j, row in self.cover.items()}
        mu = {c: min(0.0, row.dual_value()) for c, row in self.capacity.items()}
        return self.objective.Value(), pi, mu

    def _solve(self, deadline: float | None) -> int:
        left_ms = 10**9 if deadline is None else max(1, int(1000 * (deadline - time.perf_counter())))
        self.solver.SetTimeLimit(left_ms)  # set every time: a limit stays on the solver otherwise
        return self.solver.Solve()

    def values(self) -> list[float]:
        return [v.solution_value() for v in self.vars]

    @staticmethod
    def _pace(per: int, open_jobs: int, fixed: list[Column], round_s: float, left_s: float) -> int:
        """Columns to fix this round: ``per``, or more when the rounds left at that pace (open jobs
        over ``per`` columns of the fixed columns' mean size) would take longer than 80 % of the time left."""
        size = sum(len(c.jobs) for c in fixed) / len(fixed) if fixed else 3.0
        rounds_left = open_jobs / (size * per)
        if rounds_left * round_s <= 0.8 * left_s:
            return per
        return max(per, math.ceil(open_jobs / (size * max(1.0, 0.8 * left_s / max(round_s, 1e-3)))))

    def unfix(self) -> None:
        """Undo a dive's fixings (its columns stay)."""
        for var in self.vars:
            if var.lb() > 0:
                var.SetLb(0)

    def dive(self, deadline: float, per: int = 1, price=None, noise: float = 0.0, seed: int = 0,
             usable=None) -> list[int] | None:
        """Round the LP by diving: fix the columns at one and the largest fractional one, solve
        again (warm), until the solution is integral. Up to ``per`` fractional columns are fixed at a
        time, pairwise disjoint and within the node counts, so the fixings stay feasible. With
        ``price(pi, mu, fixed_jobs)`` (new columns for the jobs the fixings leave), a few pricing
        rounds follow every fixing: the columns that complete the partial plan then exist. When the
        rounds so far show that this pace would not end in time, it fixes more per round, so that
        it ends with a plan rather than out of time. Returns the chosen columns, or None when time ran
        out or GLOP failed; ``last_x`` then holds the last LP solution, fixings included. Leaves the
        fixings in place. With ``noise`` > 0 the fractional columns are ranked by their value times a
        random factor in [1, 1 + noise) (seeded): another dive from the same LP. With ``usable(i)``,
        a column is fixed (or kept at one) only when it says so; one it refuses is closed."""
        try:
            return self._dive(deadline, per, price, random.Random(seed), noise, usable)
        except LpTrouble:
            return None

    def _dive(self, deadline: float, per: int, price, rng: random.Random, noise: float, usable) -> list[int] | None:
        started, rounds = time.perf_counter(), 0
        while time.perf_counter() < deadline:
            _, pi, mu = self.solve(deadline)
            if price is not None:
                taken = {j for i, v in enumerate(self.values()) if v >= 1 - 1e-6 for j in self.columns[i].jobs}
                for _ in range(3):
                    fresh = price(pi, mu, taken)
                    if not fresh:
                        break
                    for column in fresh:
                        self.add(column)
                    _, pi, mu = self.solve(deadline)
            x = self.last_x = self.values()
            refused = [] if usable is None else \
                [i for i, v in enumerate(x) if v >= 1 - 1e-6 and self.vars[i].lb() < 1 and not usable(i)]
            if refused:
                self.close(refused)
                continue
            fractional = [i for i, v in enumerate(x) if 1e-6 < v < 1 - 1e-6]
            if not fractional:
                return [i for i, v in enumerate(x) if v > 0.5]
            fixed = [i for i, v in enumerate(x) if v >= 1 - 1e-6]
            taken = {j for i in fixed for j in self.columns[i].jobs}
            nodes: dict[str, int] = {}
            for i in fixed:
                for c, n in self.columns[i].nodes:
                    nodes[c] = nodes.get(c, 0) + n
            for i in fixed:
                self.vars[i].SetLb(1)
            # The largest fractional columns, up to ``per``, that share no job and fit the nodes.
            rounds += 1
            most = self._pace(per, len(self.job_ids) - len(taken), [self.columns[i] for i in fixed],
                              (time.perf_counter() - started) / rounds, deadline - time.perf_counter())
            picked = 0
            rank = {i: x[i] * (1 + noise * rng.random()) for i in fractional}
            for i in sorted(fractional, key=lambda i: -rank[i]):
                col = self.columns[i]
                if taken.intersection(col.jobs) or any(nodes.get(c, 0) + n > self.nodes[c] for c, n in col.nodes):
                    continue
                if usable is not None and not usable(i):
                    self.close([i])
                    continue
                self.vars[i].SetLb(1)
                taken.update(col.jobs)
                for c, n in col.nodes:
                    nodes[c] = nodes.get(c, 0) + n
                picked += 1
                if picked >= most:
                    break
        return None


# ----- pricing heuristic (the exact pricing is planner/pricing.py) -----------------------------
@dataclass
class _Class:
    cluster: str
    width: int
    members: list[int]  # positions in the group
    busy: list[float]  # per member: rollout duration, and its switch
    mem: float


def price_greedy(builder: CandidateBuilder, pi: dict[int, float], mu: dict[str, float], *, extra: dict[int, float],
                 seeds: int = 60, max_columns: int = 200) -> list[Candidate]:
    """Fast pricing heuristic: from each of the most valuable jobs, add the job of best value minus
    added node cost while the group stays load-feasible (the rules of ``price_groups``); every
    group of negative reduced cost met on the way is a column. Proves nothing; CP-SAT does that."""
    node_price = {c: builder.price[c] - mu.get(c, 0.0) for c in builder.price}
    value = {j: pi[j] - extra.get(j, 0.0) for j in builder.job_ids}
    found: dict[tuple, tuple[float, Candidate]] = {}
    keys: dict[tuple, list[int]] = {}
    for j in builder.job_ids:
        if value[j] > EPS:
            for t in builder.train_opts[j]:
                keys.setdefault((t.gpu_type, t.cluster, t.gpus), []).append(j)
    for key, members in keys.items():
        trains = {j: next(t for t in builder.train_opts[j] if (t.gpu_type, t.cluster, t.gpus) == key) for j in members}
        # Per member, once per key: its train load and its rollout options with their loops.
        info = {j: (load_s(trains[j], True), trains[j].host_mem_gb,
                    [(o, builder.loop_s(j, trains[j], o), load_s(o, True)) for o in builder.rollout_opts[j]])
                for j in members}
        members.sort(key=lambda j: -value[j])
        for seed in members[:seeds]:
            for first in builder.rollout_opts[seed]:
                _grow_greedy(builder, key, trains, info, members, value, node_price, seed, first, found)
    ranked = sorted(found.values(), key=lambda item: item[0])
    return [cand for _, cand in ranked[:max_columns]]


def _grow_greedy(builder, key, trains, info, pool, value, node_price, seed, first, found) -> None:
    topo = builder.topo
    train_cluster = key[1]
    train_mem_cap = topo.clusters[train_cluster].host_mem_gb
    caps = builder.cap
    if not fits_cap(builder.loop_s(seed, trains[seed], first), caps[seed]):
        return
    group, rollouts = [seed], [first]
    classes = [_Class(first.cluster, first.nodes, [0], [load_s(first, True)], first.host_mem_gb)]
    cap = caps[seed]
    max_loop = builder.loop_s(seed, trains[seed], first)  # every member's loop must fit the group's cap
    train_busy, train_mem = info[seed][0], info[seed][1]
    fixed = node_price[train_cluster] * trains[seed].nodes
    rollout_cost = node_price[first.cluster] * first.nodes
    gain = value[seed]
    while len(group) < builder.k:
        best = None
        # Classes shared by two members or more must keep within the (possibly smaller) new cap.
        shared = max((sum(c.busy) for c in classes if len(c.members) > 1), default=0.0)
        for j in pool:
            if j in group:
                continue
            new_cap = min(cap, caps[j])
            limit = new_cap + TIME_TOL  # fits_cap, inline: the greedy's inner loop
            tau, mem, options = info[j]
            if max_loop > limit or train_busy + tau > limit or not fits_memory(train_mem + mem, train_mem_cap) \
                    or shared > limit:
                continue
            for o, loop, busy_o in options:
                if loop > limit:
                    continue
                # Join the first class it fits in (no added nodes), else open a class.
                target, added = None, node_price[o.cluster] * o.nodes
                for ci, c in enumerate(classes):
                    if c.cluster != o.cluster or c.width != o.nodes:
                        continue
                    if sum(c.busy) + busy_o <= limit and fits_memory(c.mem + o.host_mem_gb, topo.clusters[o.cluster].host_mem_gb):
                        target, added = ci, 0.0
                        break
                score = value[j] - added
                if best is None or score > best[0]:
                    best = (score, j, o, target, new_cap, loop)
        if best is None or best[0] <= EPS:
            return
        _, j, o, target, cap, loop = best
        max_loop = max(max_loop, loop)
        group.append(j)
        rollouts.append(o)
        train_busy += info[j][0]
        train_mem += info[j][1]
        gain += value[j]
        if target is None:
            classes.append(_Class(o.cluster, o.nodes, [len(group) - 1], [load_s(o, True)], o.host_mem_gb))
            rollout_cost += node_price[o.cluster] * o.nodes
        else:
            c = classes[target]
            c.members.append(len(group) - 1)
            c.busy.append(load_s(o, True))
            c.mem += o.host_mem_gb
        reduced = fixed + rollout_cost - gain
        if reduced < -EPS:
            order = sorted(range(len(group)), key=lambda p: group[p])
            where = {p: i for i, p in enumerate(order)}
            cand = make_candidate(builder, [group[p] for p in order], [trains[group[p]] for p in order],
                                  [rollouts[p] for p in order], [sorted(where[p] for p in c.members) for c in classes])
            if cand not in found or reduced < found[cand][0]:
                found[cand] = (reduced, cand)


# ----- integer master ----------------------------------------------------------------------------
@dataclass
class IntegerResult:
    status: str
    chosen: list[int]
    rejected: list[int]
    objective: float | None
    bound: float | None  # valid for the columns given; None when the solver does not report one


def solve_integer(columns: list[Column], job_ids: list[int], topo: Topology, *, allowed: Iterable[int],
                  penalty: float, time_limit_s: float, threads: int, solver: str = "cpsat",
                  hint: Incumbent | None = None, exclusive: list[list[int]] = (),
                  used: Mapping[str, int] | None = None, small: bool = False) -> IntegerResult:
    """Each of ``job_ids`` in one of the ``allowed`` columns or rejected at ``penalty``, within the
    topology's nodes less those ``used`` (per cluster) by a rest of the plan held fixed.
    ``exclusive``: sets of columns of which at most one may be chosen (pinned groups that share a
    physical node). ``small``: a few hundred columns, for CP-SAT without presolve, probing or symmetry
    detection (120 of the search's models at 300 RH jobs: 2.4 s against 4.7 s, the same optima)."""
    capacity = {c: spec.nodes - (used or {}).get(c, 0) for c, spec in topo.clusters.items()}
    if solver == "pulp":
        return _solve_integer_pulp(columns, job_ids, capacity, allowed=allowed, penalty=penalty,
                                   time_limit_s=time_limit_s, threads=threads, exclusive=exclusive, hint=hint)
    cp = cp_model.CpModel()
    x = {i: cp.new_bool_var(f"c{i}") for i in allowed}
    r = {j: cp.new_bool_var(f"r{j}") for j in job_ids}
    covers, usage = _rows(columns, x, r)
    for vars_ in covers.values():
        cp.add_exactly_one(vars_)
    for cluster, terms in usage.items():
        cp.add(sum(terms) <= capacity[cluster])
    for group in exclusive:
        cp.add_at_most_one([x[i] for i in group if i in x])
    units = {i: objective_units(columns[i].objective) for i in x}
    cp.minimize(sum(units[i] * var for i, var in x.items()) + objective_units(penalty) * sum(r.values()))
    if hint is not None:
        chosen = set(hint.columns)
        for i, var in x.items():
            cp.add_hint(var, int(i in chosen))
        for j, var in r.items():
            cp.add_hint(var, int(j in hint.rejected))
    sat = cp_model.CpSolver()
    sat.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    sat.parameters.num_workers = max(1, threads)
    sat.parameters.cp_model_presolve = not small
    if small:
        sat.parameters.cp_model_probing_level = sat.parameters.symmetry_level = 0
    status = sat.solve(cp)
    name = sat.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return IntegerResult(name, [], [], None, None)
    return IntegerResult(name, [i for i, v in x.items() if sat.value(v)], [j for j, v in r.items() if sat.value(v)],
                         sat.objective_value / OBJECTIVE_SCALE, sat.best_objective_bound / OBJECTIVE_SCALE)


def _rows(columns: list[Column], x: dict, r: dict) -> tuple[dict[int, list], dict[str, list]]:
    """The master's rows for any solver: per job the variables covering it (its rejection first),
    per cluster the node-count terms."""
    covers: dict[int, list] = {j: [var] for j, var in r.items()}
    usage: dict[str, list] = {}
    for i, var in x.items():
        for j in columns[i].jobs:
            covers[j].append(var)
        for cluster, n in columns[i].nodes:
            usage.setdefault(cluster, []).append(n * var)
    return covers, usage


def _solve_integer_pulp(columns: list[Column], job_ids: list[int], capacity: Mapping[str, int], *,
                        allowed: Iterable[int], penalty: float, time_limit_s: float, threads: int,
                        exclusive: list[list[int]] = (), hint: Incumbent | None = None) -> IntegerResult:
    import pulp

    prob = pulp.LpProblem("weave_master", pulp.LpMinimize)

    def binary(name: str):
        if hasattr(prob, "add_variable"):  # PuLP >= 3.3 attaches variables to the problem
            return prob.add_variable(name, 0, 1, cat="Binary")
        return pulp.LpVariable(name, cat="Binary")

    x = {i: binary(f"c{i}") for i in allowed}
    r = {j: binary(f"r{j}") for j in job_ids}
    prob += pulp.lpSum(columns[i].objective * v for i, v in x.items()) + penalty * pulp.lpSum(r.values())
    covers, usage = _rows(columns, x, r)
    for j, vars_ in covers.items():
        prob += pulp.lpSum(vars_) == 1, f"cover{j}"
    for cluster, terms in usage.items():
        prob += pulp.lpSum(terms) <= capacity[cluster], f"nodes_{cluster}"
    for k, group in enumerate(exclusive):
        prob += pulp.lpSum(x[i] for i in group if i in x) <= 1, f"exclusive{k}"
    if hint is not None:  # CBC starts from the best known plan
        chosen = set(hint.columns)
        for i, var in x.items():
            var.setInitialValue(int(i in chosen))
        for j, var in r.items():
            var.setInitialValue(int(j in hint.rejected))
    with warnings.catch_warnings():  # PuLP 3.3 announces CBC's move to an extra for 4.0 (pinned < 4)
        warnings.simplefilter("ignore", DeprecationWarning)
        cbc = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, int(math.ceil(time_limit_s))), threads=max(1, threads),
                                warmStart=hint is not None)
        prob.solve(cbc)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return IntegerResult(pulp.LpStatus[prob.status].upper(), [], [], None, None)
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    objective = pulp.value(prob.objective) or 0.0
    return IntegerResult("OPTIMAL" if optimal else "FEASIBLE",
                         [i for i, v in x.items() if (v.value() or 0) > 0.5],
                         [j for j, v in r.items() if (v.value() or 0) > 0.5],
                         objective, objective if optimal else None)
