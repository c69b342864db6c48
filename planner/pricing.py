"""Exact pricing for column generation: the co-execution group of most negative reduced cost.

Reduced cost of a group G under duals ``value_j`` (a job's cover dual minus any migration charge)
and node prices ``price'_c`` (price minus the node-capacity dual)::

    rc(G) = price'_T * train_nodes + sum over rollout classes price'_c * class_width - sum_{j in G} value_j

Every group has a *leader*: its member of smallest cycle cap ``slo * solo`` (ties by index), which
fixes the group's cap ``C``. For each training pool (a cluster and a width ``W`` in nodes, any
member's option on at most ``W`` nodes) and leader, a depth-first search adds members of larger cap
in order of decreasing value, keeping the pool's node-time (trains and warm switches), host memory
and every member's own loop within ``C``. A branch is cut when no completion can reach the
threshold, by four lower bounds on the rollout side: each member needs a class at least as dear as
its cheapest; a class runs at most ``C`` seconds of rollout per node, so rollouts cost at least
``sum_j price'_c * nodes_j * rollout_j / C``; a class holds at most one rollout longer than ``C / 2``;
and each member yields at most the best value-less-cost per member of any class that may hold it
(``_Search._shares``). Leaves that pass are costed exactly: every layout of their trains on the pool,
every choice of rollout options and partition into classes, laid out by ``class_layout`` (planner/rules.py,
the candidate rules), unless a floor (each cluster's rollout node-time over ``C``; one-node rollouts'
bins) cannot beat the threshold. Exact over the candidate space; out of time, it proves nothing.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from weave_rl.planner import kernel
from weave_rl.planner.optimal import Candidate, CandidateBuilder, make_candidate
from weave_rl.planner.rules import TIME_TOL as TOL, class_layout, fits_cap, load_s

EPS = 1e-6


_UNSEEN = object()


@functools.lru_cache(maxsize=None)
def _lowest(n: int) -> list[tuple[int, int, int]]:
    """Per non-empty bit mask of positions 0..n-1, in increasing order: (mask, its lowest
    position, the mask without it)."""
    return [(mask, (mask & -mask).bit_length() - 1, mask & (mask - 1)) for mask in range(1, 1 << n)]


@functools.lru_cache(maxsize=None)
def _members(n: int) -> list[tuple[int, ...]]:
    """Per bit mask of positions 0..n-1: the positions it holds."""
    return [tuple(i for i in range(n) if mask >> i & 1) for mask in range(1 << n)]


@dataclass
class Pricing:
    columns: list[Candidate]
    rc_lower_bound: float  # no column of the model has a smaller reduced cost (-inf: not proven)
    proven: bool
    nodes: int = 0  # search nodes visited
    # No plan (nor LP solution) has a smaller sum of reduced costs: the sum over leaders of each
    # leader's least reduced cost (None when some leader has no bound). See ``price_exact``.
    rc_sum_bound: float | None = None


def price_exact(builder: CandidateBuilder, pi: dict[int, float], mu: dict[str, float], *,
                extra: dict[int, float], deadline: float, max_columns: int = 300, stop_after: int | None = None,
                rotation: dict | None = None, threshold: float = 0.0, pool: "PricingPool | None" = None,
                mixed: bool = True, per_leader: int | None = None, only_mixed: bool = False) -> Pricing:
    """All groups of negative reduced cost (the ``max_columns`` most negative) and a proven bound.

    Without ``mixed``, only groups whose members train at one GPU count (a far smaller search where
    jobs have several counts: column generation converges on them first); its bound is then a
    bound of those groups only, unless ``builder.uniform_pools()``. With ``only_mixed``, groups
    whose members train at one GPU count are not costed: a pricing without ``mixed`` at the same
    duals proved that none improves.

    With ``stop_after``, the search stops once it has found that many columns (nothing proven):
    early column-generation rounds need columns, not proofs; with a ``pool``, that many in all (a
    shared tally). ``rotation`` (kept by the caller) makes the next call start at the leader where
    this one stopped, so no leader is starved.
    With ``threshold`` > 0 it collects every column of reduced cost below it instead (columns near
    the LP optimum, from which the integer master builds its plans; the bound is then not used). With
    a ``pool``, its worker processes search disjoint sets of leaders at once. With ``per_leader``,
    only each leader's ``per_leader`` most negative groups are kept, and once it has that many the
    search for it looks only for better ones (the bounds are unchanged), or in an early round stops:
    a round's columns come from many leaders, not from the hundred variants of a few.

    Per-leader bound (when the search is complete): every group has one leader, and the groups a job
    leads all hold it, so in any plan (or LP solution) their values sum to at most one. Hence
    sum_G rc_G x_G >= sum_m min(0, rho_m), rho_m the least reduced cost of a group led by m: the
    Lagrangian bound ``LP + rc_sum_bound``, tighter than ``K * rc_min`` when few leaders still
    have improving groups."""
    rotation = rotation if rotation is not None else {}
    parts = pool.workers if pool is not None else 1
    args = [(pi, mu, extra, deadline, stop_after, rotation.get(part, {}), threshold, part, parts, mixed, per_leader,
             only_mixed) for part in range(parts)]
    if pool is not None:
        results = pool.map(args)
    else:
        results = [_price_part(builder, *args[0])]
    return _merged(results, rotation, max_columns)


def _merged(results: list[tuple], rotation: dict, max_columns: int) -> Pricing:
    """One pricing from its parts' results (see ``_price_part``)."""
    found: dict[Candidate, float] = {}
    proven, visited, rc_min = True, 0, 0.0
    leaders: dict[int, float] | None = {}
    for part, (part_found, part_proven, part_visited, part_rc, part_rotation, part_leaders) in enumerate(results):
        for cand, rc in part_found.items():
            found[cand] = min(rc, found.get(cand, rc))
        proven = proven and part_proven
        visited += part_visited
        rc_min = min(rc_min, part_rc)
        rotation[part] = part_rotation
        if part_leaders is None or leaders is None:
            leaders = None
        else:
            for m, rc in part_leaders.items():
                leaders[m] = min(rc, leaders.get(m, 0.0))
    ranked = sorted(found.items(), key=lambda item: item[1])[:max_columns]
    rc_sum = None if leaders is None else sum(min(0.0, rc) for rc in leaders.values())
    if not proven:
        return Pricing([c for c, _ in ranked], -math.inf, False, visited, rc_sum)
    rc_min = min([rc_min, -EPS] + list(found.values()))
    return Pricing([c for c, _ in ranked], rc_min, True, visited, rc_sum)


def _price_part(builder: CandidateBuilder, pi, mu, extra, deadline, stop_after, rotation, threshold, part, parts,
                mixed=True, per_leader=None, only_mixed=False, tally=None):
    """One share of the search: the leaders whose position is ``part`` modulo ``parts`` (and the
    single-job groups in share 0); ``tally``, in a pool: the columns each share has found so far
    (``_Search.enough``). Returns (found, proven, visited, least singleton rc, rotation, leaders),
    ``leaders`` the least reduced cost of the groups each job leads (None when the search
    stopped early)."""
    node_price = {c: builder.price[c] - mu.get(c, 0.0) for c in builder.price}
    value = {j: pi[j] - extra.get(j, 0.0) for j in builder.job_ids}
    found: dict[Candidate, float] = {}
    rc_min = 0.0
    singles: dict[int, float] = {}
    for j in builder.job_ids if part == 0 else ():  # singletons
        for t in builder.train_opts[j]:
            for o in builder.rollout_opts[j]:
                if fits_cap(builder.loop_s(j, t, o), builder.cap[j]):
                    rc = node_price[t.cluster] * t.nodes + node_price[o.cluster] * o.nodes - value[j]
                    rc_min = min(rc_min, rc)
                    singles[j] = min(rc, singles.get(j, rc))
                    if rc < threshold - EPS:
                        found[make_candidate(builder, [j], t, [o], [[0]], [0])] = rc
    search = _Search(builder, value, node_price, found, deadline, stop_after, rotation, threshold, (part, parts),
                     per_leader, only_mixed, tally)
    # Jobs of no value are left out: removing one from a group never raises its reduced cost, so
    # the least reduced costs (and the per-leader bound) are those of groups without them.
    widths: dict[str, set[int]] = {}
    for t in (t for j in builder.job_ids for t in builder.train_opts[j]):
        widths.setdefault(t.cluster, set()).add(t.nodes)
    # (GPU type, cluster, pool width, GPU count or None for any option that fits) -> its jobs
    keys: dict[tuple, list[int]] = {}
    if builder.k >= 2:
        for j in builder.job_ids:
            if value[j] > EPS:
                for t in builder.train_opts[j]:
                    pools = [(t.gpu_type, t.cluster, w, None) for w in widths[t.cluster] if w >= t.nodes] \
                        if mixed else [(t.gpu_type, t.cluster, t.nodes, t.gpus)]
                    for key in pools:
                        if j not in keys.setdefault(key, []):
                            keys[key].append(j)
    complete = True
    for key, members in sorted(keys.items()):
        if len(members) >= 2 and not search.run(key, members):
            complete = False
            break
        if search.enough():
            complete = False
            break
    search.enough()  # the others see what this share found
    complete = complete and not search.cut
    leaders: dict[int, float] | None = None
    if complete:
        leaders = dict(singles)
        for (_, m), rc in search.best.items():
            leaders[m] = min(rc, leaders.get(m, rc))
    return found, complete, search.visited, rc_min, rotation, leaders


_SHARED: dict = {}  # the builder and the tally, inherited by the pool's forked workers


def _work(args):
    return _price_part(_SHARED["builder"], *args, tally=_SHARED["tally"])


class PricingPool:
    """Worker processes (forked: they share the builder read-only) and the caller price in parallel
    (groups are costed in Python: processes use the other cores). The caller's own share warms its
    builder's layouts by cap for the bound's pricing forked from it (optimize.py ``_go_on``)."""

    def __init__(self, builder: CandidateBuilder, workers: int):
        import multiprocessing

        context = multiprocessing.get_context("fork")
        _SHARED["builder"] = builder
        _SHARED["tally"] = self._tally = context.RawArray("i", workers)  # columns found, per share
        self.workers = workers
        self._pool = context.Pool(workers - 1)

    def map(self, args: list) -> list:
        self._tally[:] = [0] * self.workers
        others = self._pool.map_async(_work, args[1:])
        return [_work(args[0])] + others.get()

    def close(self) -> None:
        self._pool.terminate()
        _SHARED.clear()


class _Leader(NamedTuple):
    """What the search for one training pool and leader needs, and what costing its groups does."""

    leader: int
    key: tuple
    trains: dict  # job -> its training options that fit the pool
    mem_cap: float
    cap: float  # the leader's cycle cap
    limit: float  # most pool node-time share a group may take (see ``_Search._context``)
    opts: dict  # job -> rollout options whose loop fits the cap
    cands: list  # members that may join, by decreasing value
    fixed: float  # the training pool's cost
    per: np.ndarray  # ``kernel.search``'s rows, per candidate and then the leader
    tops: np.ndarray  # ``kernel.search``'s best gains from each candidate on
    layouts: np.ndarray  # ``kernel.search``'s training options, per candidate and then the leader


class _Search:
    def __init__(self, builder, value, node_price, found, deadline, stop_after, rotation, threshold=0.0,
                 share: tuple[int, int] = (0, 1), per_leader: int | None = None, only_mixed: bool = False,
                 tally=None):
        self.only_mixed = only_mixed  # groups of one training GPU count are known not to improve
        self.share = share  # (part, parts): this search takes the leaders at position part mod parts
        self.threshold = threshold - EPS  # keep columns of reduced cost below this
        # The current leader's bar: ``threshold``, or once it has ``per_leader`` columns the
        # reduced cost of its worst kept one (a list, so the search's closure sees it move).
        self.bar = [self.threshold]
        self.per_leader = per_leader
        self._kept: dict[int, list] = {}  # leader -> heap of (-rc, order, candidate) it keeps
        self._order = itertools.count()
        self.best: dict[tuple, float] = {}  # (key, leader) -> least reduced cost of a group found
        self.stop_after = stop_after
        self.cut = False  # a leader's search stopped at its quota: its least reduced cost is unproven
        self.tally = tally
        self.rotation = rotation
        self.b = builder
        self.value = value
        self.price = node_price
        self.found = found
        self.deadline = deadline
        self.visited = 0
        self._classes: dict = {}
        self._layouts: dict = {}
        self._fitting: dict = {}

    def run(self, key: tuple, pool: list[int]) -> bool:
        """Search every leader of this training pool; False when out of time."""
        setup = self._pool_setup(key, pool)
        order = setup[0]
        first = self.rotation.get(key, 0) % len(order)
        for step in range(len(order)):
            li = (first + step) % len(order)
            if li % self.share[1] != self.share[0]:
                continue
            if self.enough():
                self.rotation[key] = li
                return False
            ctx = self._context(key, setup, li)
            if ctx is None:  # this leader leads no group of two
                continue
            m = ctx.leader
            kept = self._kept.get(m, ())
            self.bar[0] = self.threshold if len(kept) < (self.per_leader or math.inf) else \
                min(self.threshold, -kept[0][0])
            if not self._dfs(ctx):
                self.rotation[key] = li + 1  # the next call starts after this leader
                return False
        return True

    def enough(self) -> bool:
        """Whether ``stop_after`` columns are found: here, or in all the pool's shares together (the
        ``tally``, where this one's count is written)."""
        if self.stop_after is None:
            return False
        if self.tally is None:
            return len(self.found) >= self.stop_after
        self.tally[self.share[0]] = len(self.found)
        return sum(self.tally) >= self.stop_after

    def _pool_setup(self, key: tuple, pool: list[int]) -> tuple:
        """Leaders' order (by cap), and what every leader's context needs, once per training pool."""
        b = self.b
        _, cluster, width, gpus = key
        trains = {j: [t for t in b.train_opts[j] if t.cluster == cluster and t.nodes <= width
                      and gpus in (None, t.gpus)] for j in pool}
        tau = {j: min(load_s(t, True) * t.nodes / width for t in trains[j]) for j in pool}
        mem = {j: min(t.host_mem_gb * t.nodes / width for t in trains[j]) for j in pool}
        order = sorted(pool, key=lambda j: (b.cap[j], j))
        return order, trains, tau, mem

    def _context(self, key: tuple, setup: tuple, li: int) -> "_Leader | None":
        """The search context of the leader at position ``li`` (None when it leads no group of two)."""
        b = self.b
        order, trains, tau, mem = setup
        train_mem_cap = b.topo.clusters[key[1]].host_mem_gb
        m = order[li]
        cap = b.cap[m]
        # Every node of a pool of two or more is shared (and pays warm switches) but those the widest
        # member holds alone, at most W - 1 of W: the node-time a group needs is at least the sum of
        # its shares less (W - 1) / W of the largest switch, which is within ``cap`` on average.
        width = key[2]
        narrow = [t for j in order[li:] for t in trains[j] if t.nodes < width]
        limit = cap + TOL + ((width - 1) / width * max(t.switch_s for j in order[li:] for t in trains[j])
                             if narrow else 0.0)
        # Layouts and the rollout options that fit depend on the cap, not the duals: kept across
        # passes (each pass meets most again).
        self._classes = b.laid_out.setdefault(cap, {})
        self._layouts = b.laid_out.setdefault((key, cap), {})
        fitting = b.laid_out.setdefault((key, cap, "rollouts"), {})
        self._fitting = {}
        self._cap = cap
        opts = {}
        for j in order[li:]:
            if j != m and (tau[m] + tau[j] > limit or mem[m] + mem[j] > train_mem_cap + TOL):
                continue
            ok = fitting.get(j)
            if ok is None:
                ok = fitting[j] = [o for o in b.rollout_opts[j]
                                   if any(fits_cap(b.loop_s(j, t, o), cap) for t in trains[j])]
            if ok:
                opts[j] = ok
        if m not in opts or len(opts) < 2:
            return None
        others = [j for j in opts if j != m]
        # A group on this pool has a member as wide as it (narrower groups are another pool's): when
        # the leader is narrow, wide jobs come first, and a branch past them with none is cut.
        wide = {j: any(t.nodes == width for t in trains[j]) for j in opts}
        if not any(wide.values()):
            return None
        cands = sorted(others, key=lambda j: (not wide[m] and not wide[j], -self.value[j]))
        wide_after = [False] * (len(cands) + 1)
        for i in range(len(cands) - 1, -1, -1):
            wide_after[i] = wide_after[i + 1] or wide[cands[i]]
        cheapest = {j: min(self.price[o.cluster] * o.nodes for o in opts[j]) for j in opts}
        area = {j: min(self.price[o.cluster] * o.nodes * o.duration_s / cap for o in opts[j]) for j in opts}
        # A class holds at most one rollout longer than half the cap (two would not fit), so such
        # "big" members each pay at least their cheapest class (Martello-Toth's bin-packing bound).
        big = {j: cheapest[j] if all(o.nodes == 1 and o.duration_s + o.switch_s > cap / 2 + TOL
                                     for o in opts[j]) else 0.0 for j in opts}
        share = self._shares(opts, area, cap) or dict.fromkeys(opts, math.inf)  # inf: no bound from shares
        # The least node-seconds of each member's rollout and the least node price it may pay: no
        # choice of rollouts has a floor (``_rollout_floor``) under the sum's whole nodes at the least price.
        node_s = {j: min(o.nodes * o.duration_s for o in opts[j]) for j in opts}
        unit = {j: min(self.price[o.cluster] for o in opts[j]) for j in opts}
        # when every rollout option is one node wide: their least busy time, for the bins floor (else -1)
        one = {j: min(load_s(o, True) for o in opts[j]) if all(o.nodes == 1 for o in opts[j]) else -1.0 for j in opts}
        columns = cands + [m]
        rows = (tau, mem, self.value, area, cheapest, big, wide, share, node_s, unit)
        per = np.array([[row[j] for j in columns] for row in rows] + [wide_after, [one[j] for j in columns]])
        most = max(len(trains[j]) for j in columns)
        layouts = np.array([[(t.nodes, t.duration_s, t.switch_s, t.host_mem_gb) for t in trains[j]]
                            + [(0, 0.0, 0.0, 0.0)] * (most - len(trains[j])) for j in columns], dtype=float)
        tops = kernel.suffix_tops(np.array([[gain[j] for j in cands] for gain in (
            self.value, {j: self.value[j] - area[j] for j in opts}, {j: self.value[j] - big[j] for j in opts}, share)]),
            b.k - 1)
        return _Leader(m, key, trains, train_mem_cap, cap, limit, opts, cands, self.price[key[1]] * width, per, tops,
                       layouts)

    def _shares(self, opts: dict, area: dict, cap: float) -> dict | None:
        """Per member j, at least ``(sum of its class's values - the class's cost) / class size`` for every
        rollout class that may hold it at this cap: a group's reduced cost is its pool's cost less its
        members' yields, so it is at least ``fixed - sum_j share_j``. A class of one yields
        ``value - its nodes``; a class of two one-node rollouts needs their loads with warm switches
        within the cap (the partner of best value that fits, by a prefix maximum over loads); a
        wider class of two costs two nodes at least; a class of three or more needs, on its cluster,
        three members' node-time within its widest option's node-time, and costs at least its
        members' areas (so yields at most their mean ``u``). None when a class of three may hold
        every member: the mean then bounds little (300 Hetero jobs), and the search is quicker
        without it."""
        value, price, k = self.value, self.price, self.b.k
        ones: dict[str, list] = {}  # cluster -> (load, value, job) of one-node options
        wider: dict[str, dict] = {}  # cluster -> job -> its value, for members with a wider option there
        least_nt: dict[str, dict] = {}  # cluster -> job -> its least node-time there
        widest: dict[str, int] = {}
        for j, options in opts.items():
            for o in options:
                c = o.cluster
                widest[c] = max(widest.get(c, 0), o.nodes)
                nt = least_nt.setdefault(c, {})
                nt[j] = min(nt.get(j, math.inf), o.nodes * o.duration_s)
                if o.nodes == 1:
                    ones.setdefault(c, []).append((load_s(o, True), value[j], j))
                else:
                    wider.setdefault(c, {})[j] = value[j]
        # Per cluster, its three least node-times (with their members): a class of three or more
        # holds a member and two others within its widest option's node-time.
        small = {c: heapq.nsmallest(3, ((t, j) for j, t in nt.items())) for c, nt in least_nt.items()}

        def crowd(j: int, o) -> bool:
            others = [t for t, i in small[o.cluster] if i != j][:2]
            return len(others) == 2 and o.nodes * o.duration_s + others[0] + others[1] <= widest[o.cluster] * cap + TOL

        crowded = {j: any(crowd(j, o) for o in options) for j, options in opts.items()}
        if all(crowded.values()):
            return None
        prefix = {c: _prefix_best(sorted(entries)) for c, entries in ones.items()}
        best_wider = {c: heapq.nlargest(2, ((v, j) for j, v in values.items())) for c, values in wider.items()}
        top_u = heapq.nlargest(k, ((value[j] - area[j], j) for j in opts))
        share = {}
        for j, options in opts.items():
            best = -math.inf
            for o in options:
                c, p = o.cluster, price[o.cluster]
                best = max(best, value[j] - p * o.nodes)
                if o.nodes == 1 and c in prefix:  # a one-node partner whose load fits beside it
                    loads, tops = prefix[c]
                    at = bisect.bisect_right(loads, cap + TOL - load_s(o, True))
                    partner = _other(tops[at - 1], j) if at else None
                    if partner is not None:
                        best = max(best, (value[j] + partner - p) / 2)
                # a wider partner (two nodes at least), or any partner of a wider option
                partners = [_other(best_wider.get(c, []), j)]
                if o.nodes > 1 and c in prefix:
                    partners.append(_other(prefix[c][1][-1], j))
                partners = [v for v in partners if v is not None]
                if partners:
                    best = max(best, (value[j] + max(partners) - p * max(2, o.nodes)) / 2)
            if crowded[j]:
                total = value[j] - area[j]
                for size, (u, _) in enumerate([t for t in top_u if t[1] != j][:k - 1], start=2):
                    total += u
                    if size >= 3 and total / size > best:
                        best = total / size
            share[j] = best
        return share

    def _dfs(self, ctx) -> bool:
        """Depth-first over the leader's candidates in order (``kernel.search``), each group that passes
        the floors costed here as it is met; False when time or the column quota ran out."""
        cands, k = ctx.cands, self.b.k
        state, member, at = np.zeros((k, kernel.ROWS)), np.zeros(k, np.int64), np.zeros(k, np.int64)
        state[0] = ctx.per[:kernel.ROWS, -1]
        member[0], depth = len(cands), 0
        self.visited += 1
        while depth >= 0:
            if time.perf_counter() > self.deadline or self.enough() or \
                    self.stop_after is not None and len(self.found) >= self.stop_after:
                return False
            depth, visited, leaf = kernel.search(ctx.per, ctx.tops, ctx.layouts, state, member, at, depth,
                                                 ctx.fixed, ctx.limit, ctx.mem_cap, ctx.cap, self.bar[0], k, ctx.key[2])
            self.visited += visited
            if leaf:
                self._leaf(ctx, [ctx.leader] + [cands[i] for i in member[1:depth + 1]])
        return True

    def _leaf(self, ctx, group: list[int]) -> None:
        """Exact cost of the group: every layout of its members' training options on the pool (the
        widest as wide as the pool: narrower groups are another pool's), then the best rollout
        options and classes under the candidate rules."""
        cap, width = ctx.cap, ctx.key[2]
        jobs = sorted(group)
        gain = sum(self.value[j] for j in jobs)
        budget = gain - ctx.fixed + self.bar[0] + EPS  # rollout classes must cost less for rc < the bar
        costed = set()  # the rollouts' choices already costed: the pool costs the same on any layout
        for trains in itertools.product(*[ctx.trains[j] for j in jobs]):
            if max(t.nodes for t in trains) < width or (self.only_mixed and len({t.gpus for t in trains}) == 1):
                continue
            fitting = [self._rollouts_fitting(ctx, j, t) for j, t in zip(jobs, trains)]
            choices = tuple(f[1] for f in fitting)
            if not all(choices) or choices in costed:
                continue
            # The pool before the rollouts: its layout is kept across passes (two in three leaves
            # die there on 300 Hetero jobs), the rollouts' floors depend on the duals.
            train_offsets = self._pool_layout(ctx, trains)
            if train_offsets is None:
                continue
            costed.add(choices)
            opts = {j: f[0] for j, f in zip(jobs, fitting)}
            # The choices of rollouts that may do (see ``_rollout_floor``), least floor first: once a
            # choice's floor reaches the best group found, so do the rest's.
            floors = ((ctx.fixed + self._rollout_floor(r, cap) - gain, r) for r in itertools.product(*opts.values()))
            rollouts = sorted((fr for fr in floors if fr[0] < self.bar[0]), key=lambda fr: fr[0])
            if rollouts:
                self._leaf_rollouts(ctx, jobs, trains, train_offsets, opts, rollouts, gain, budget)

    def _rollouts_fitting(self, ctx, j: int, train) -> tuple[list, tuple]:
        """Job ``j``'s rollout options whose loop with ``train`` fits the cap, and their identities;
        cached per leader."""
        key = (j, id(train))
        if key not in self._fitting:
            ok = [o for o in ctx.opts[j] if fits_cap(self.b.loop_s(j, train, o), ctx.cap)]
            self._fitting[key] = (ok, tuple(map(id, ok)))
        return self._fitting[key]

    def _pool_layout(self, ctx, trains: tuple) -> tuple[int, ...] | None:
        """Where each member's train starts in the pool (``class_layout``), or None; kept by cap (``_context``)."""
        at = tuple(map(id, trains))  # the builder holds the options
        fit = self._layouts.get(at, _UNSEEN)
        if fit is _UNSEEN:
            fit = self._layouts[at] = class_layout(list(trains), ctx.cap, ctx.mem_cap)
        return fit

    def _leaf_rollouts(self, ctx, jobs: list[int], trains: tuple, train_offsets: tuple, opts: dict,
                       choices: list[tuple], gain: float, budget: float) -> None:
        """The best rollout classes of the group on this layout of its pool, among the ``choices`` of
        rollout options (one per member) that passed ``_rollout_floor``: (floor, options), least first."""
        cap, fixed = ctx.cap, ctx.fixed
        b = self.b
        if all(len(opts[j]) == 1 and opts[j][0].nodes == 1 for j in jobs) and \
                len({opts[j][0].cluster for j in jobs}) == 1:
            need = math.ceil(sum(opts[j][0].duration_s for j in jobs) / cap - 1e-9)  # classes at least
            self._leaf_one_node(ctx, jobs, trains, train_offsets, opts, gain, budget, need)
            return
        best = None
        for floor, rollouts in choices:
            if best is not None and floor >= best[0]:
                break  # no partition of these rollouts, nor of the next, can do better
            # The classes must cost less than the budget and the best so far (``best`` as a cost).
            limit = budget - EPS if best is None else best[0] + gain - fixed
            found = self._best_classes(ctx, jobs, rollouts, limit)
            if found is not None:
                cost, part, offsets = found
                best = (fixed + cost - gain, rollouts, part, offsets)
        if best is not None and best[0] < self.bar[0]:
            rc, rollouts, part, offsets = best
            self._keep(ctx, make_candidate(b, jobs, list(trains), list(rollouts), part, offsets,
                                           list(train_offsets)), rc)

    def _best_classes(self, ctx, jobs: list[int], rollouts: tuple, limit: float) -> tuple | None:
        """The cheapest partition of the members' ``rollouts`` into classes that lay out and fit the
        topology's nodes beside the pool, when it costs less than ``limit``: (cost, classes as
        lists of positions, each member's first node in its class), else None. Depth first: the
        class of the lowest member left, largest first; a class's cost needs only its cluster and
        width, so a branch that cannot beat the best is cut before anything is laid out (most are)."""
        n = len(rollouts)
        members = _members(n)
        dear, least = self._class_costs(rollouts, ctx.cap)
        fits: dict[int, tuple | None] = {}  # per class (a bit mask of positions): its layout
        best: list = [limit, None]  # the least cost so far, and its classes with their layouts
        chosen: list[tuple[int, tuple]] = []
        clusters = self.b.topo.clusters
        pool_cluster, pool_width = ctx.key[1], ctx.key[2]

        def fit_of(mask: int):
            fit = fits.get(mask, _UNSEEN)
            if fit is _UNSEEN:
                fit = fits[mask] = self._class([(jobs[i], rollouts[i]) for i in members[mask]])
            return fit

        def extend(left: int, cost: float) -> None:
            if not left:
                nodes = {pool_cluster: pool_width}
                for _, (cluster, width, _) in chosen:
                    nodes[cluster] = nodes.get(cluster, 0) + width
                if all(k <= clusters[c].nodes for c, k in nodes.items()):
                    best[0], best[1] = cost, list(chosen)
                return
            low = left & -left
            rest = sub = left ^ low
            while True:
                cls = sub | low
                if cost + dear[cls] + least[left ^ cls] < best[0]:
                    fit = fit_of(cls)
                    if fit is not None:
                        chosen.append((cls, fit))
                        extend(left ^ cls, cost + dear[cls])
                        chosen.pop()
                if not sub:
                    return
                sub = (sub - 1) & rest

        extend((1 << n) - 1, 0.0)
        if best[1] is None:
            return None
        offsets = [0] * n
        for cls, (_, _, layout) in best[1]:
            for i, first in zip(members[cls], layout):
                offsets[i] = first
        return best[0], [list(members[cls]) for cls, _ in best[1]], offsets

    def _class_costs(self, rollouts: tuple, cap: float) -> tuple[list[float], list[float]]:
        """Per set of members (a bit mask of positions in ``rollouts``): the cost of one class of
        them, its node price times its widest member's nodes (inf when they are on two clusters);
        and the least any partition of them costs (``_rollout_floor``, cluster by cluster)."""
        size = 1 << len(rollouts)
        on: dict[str, int] = {}  # cluster -> the mask of members on it
        for i, o in enumerate(rollouts):
            on[o.cluster] = on.get(o.cluster, 0) | 1 << i
        nodes = [o.nodes for o in rollouts]
        node_s = [o.nodes * o.duration_s for o in rollouts]
        widest, seconds = [0] * size, [0.0] * size
        dear, least = [math.inf] * size, [0.0] * size
        ceil, tol = math.ceil, TOL
        for c, members in on.items():
            price = self.price[c]
            for mask, i, rest in _lowest(len(rollouts)):
                if mask & members != mask:
                    continue
                w = widest[mask] = widest[rest] if widest[rest] > nodes[i] else nodes[i]
                t = seconds[mask] = seconds[rest] + node_s[i]
                dear[mask] = price * w
                need = ceil((t - tol) / cap - 1e-9)
                least[mask] = price * (need if need > w else w)
        if len(on) > 1:  # members on several clusters: the sum of each cluster's floor
            for mask in range(1, size):
                if dear[mask] == math.inf:
                    least[mask] = sum(least[mask & m] for m in on.values())
        return dear, least

    def _rollout_floor(self, rollouts: tuple, cap: float) -> float:
        """No partition of these rollouts into classes costs less: on each cluster, classes at least as
        wide as its widest rollout, and together as many nodes as its rollouts' node-time over the cap."""
        floor = 0.0
        for cluster in {o.cluster for o in rollouts}:
            here = [o for o in rollouts if o.cluster == cluster]
            need = math.ceil((sum(o.nodes * o.duration_s for o in here) - TOL) / cap - 1e-9)
            floor += self.price[cluster] * max(need, max(o.nodes for o in here))
        return floor

    def _leaf_one_node(self, ctx, jobs: list[int], trains: tuple, train_offsets: tuple, opts: dict, gain: float,
                       budget: float, need: int) -> None:
        """One rollout option per job, one node wide, one cluster: the cheapest classes are the fewest
        bins of capacity ``cap`` (warm switches counted when a bin is shared) and node host memory."""
        cap, fixed = ctx.cap, ctx.fixed
        options = [opts[j][0] for j in jobs]
        cluster = options[0].cluster
        price = self.price[cluster]
        busy = [load_s(o, True) for o in options]
        mem = [o.host_mem_gb for o in options]
        most = int(math.ceil((budget - EPS) / price)) - 1  # bins that still leave a negative rc
        fewest = max(1, need, kernel.bins_floor(np.array(busy), cap))
        if fewest > most:
            return
        bins, classes = _fewest_bins(busy, mem, cap, self.b.topo.clusters[cluster].host_mem_gb, fewest)
        if bins > most:
            return
        rc = fixed + price * bins - gain
        if rc < self.bar[0]:
            self._keep(ctx, make_candidate(self.b, jobs, list(trains), options, [sorted(c) for c in classes],
                                           None, list(train_offsets)), rc)

    def _keep(self, ctx, cand: Candidate, rc: float) -> None:
        at = (ctx.key, ctx.leader)
        self.best[at] = min(rc, self.best.get(at, rc))
        if self.per_leader is None or cand in self.found:
            self.found[cand] = min(rc, self.found.get(cand, rc))
            return
        kept = self._kept.setdefault(ctx.leader, [])
        entry = (-rc, next(self._order), cand)
        if len(kept) < self.per_leader:
            heapq.heappush(kept, entry)
        else:
            del self.found[heapq.heapreplace(kept, entry)[2]]  # a better one than its worst
        self.found[cand] = rc
        if len(kept) == self.per_leader:
            self.bar[0] = min(self.threshold, -kept[0][0])
            if self.stop_after is not None:  # an early round: no better ones sought (``price_exact``)
                self.bar[0], self.cut = -math.inf, True

    def _class(self, members: list) -> tuple[str, int, tuple[int, ...]] | None:
        """(cluster, width, layout) of one rollout class (its (job, option) pairs) at the leader's
        cap, or None; kept by cap (options by identity: the builder holds them)."""
        cap = self._cap
        key = tuple((j, id(o)) for j, o in members)
        if key not in self._classes:
            chosen = [o for _, o in members]
            cluster = chosen[0].cluster
            fit = None
            if all(o.cluster == cluster for o in chosen):
                layout = class_layout(chosen, cap, self.b.topo.clusters[cluster].host_mem_gb)
                if layout is not None:
                    fit = (cluster, max(o.nodes for o in chosen), layout)
            self._classes[key] = fit
        return self._classes[key]


def _fewest_bins(busy: list[float], mem: list[float], cap: float, node_mem: float,
                 at_least: int = 1) -> tuple[int, list[list[int]]]:
    """Fewest bins of capacity ``cap`` (a bin of one member always fits its node's time) and node memory
    ``node_mem`` for members of times ``busy`` and memory ``mem``, and the bins (member indices): first fit
    decreasing when it meets ``at_least`` (a known floor; almost always), else dynamic programming over subsets."""
    n = len(busy)
    if any(m > node_mem for m in mem):
        return n + 1, []  # no node holds that member's state: no packing at all
    bins: list[list[int]] = []
    room: list[tuple[float, float]] = []
    for i in sorted(range(n), key=lambda i: -busy[i]):
        for b, (t, m) in enumerate(room):
            if t + busy[i] <= cap + TOL and m + mem[i] <= node_mem:
                bins[b].append(i)
                room[b] = (t + busy[i], m + mem[i])
                break
        else:
            bins.append([i])
            room.append((busy[i], mem[i]))
    if len(bins) <= at_least:
        return len(bins), [sorted(b) for b in bins]
    full = (1 << n) - 1
    ok = [len(m) == 1 or len(m) > 1 and sum(busy[i] for i in m) <= cap + TOL and sum(mem[i] for i in m) <= node_mem
          for m in _members(n)]
    best = [0] + [n + 1] * full
    pick = [0] * (full + 1)
    for mask in range(1, full + 1):
        low = mask & -mask
        sub = mask
        while sub:  # every feasible bin holding the lowest member of ``mask``
            if sub & low and ok[sub] and best[mask ^ sub] + 1 < best[mask]:
                best[mask], pick[mask] = best[mask ^ sub] + 1, sub
            sub = (sub - 1) & mask
    classes, mask = [], full
    while mask:
        classes.append([i for i in range(n) if pick[mask] >> i & 1])
        mask ^= pick[mask]
    return best[full], classes


def _prefix_best(entries: list[tuple]) -> tuple[list[float], list[list[tuple]]]:
    """For (load, value, job) entries sorted by load: the loads, and per prefix its two best
    (value, job) of distinct jobs."""
    loads, tops, best = [], [], {}
    top: list[tuple] = []
    for load, v, j in entries:
        if v > best.get(j, -math.inf):
            best[j] = v
            top = sorted([t for t in top if t[1] != j] + [(v, j)], reverse=True)[:2]
        loads.append(load)
        tops.append(top)
    return loads, tops


def _other(top: list[tuple], j: int) -> float | None:
    """The best value among ``top``'s (value, job) whose job is not ``j``."""
    return next((v for v, i in top if i != j), None)
