"""Exact pricing's depth-first search over one leader's candidates, compiled (numba): the hot loop of
column generation. It walks an explicit stack and returns to ``pricing._Search._dfs`` at each group
that passes the floors (costed there, which may lower the bar) or after ``budget`` nodes (to check
the time): the same search, node for node, as a recursive one in Python at the current bar.

``per``'s rows, per candidate and then the leader: train node-time share, host memory, value,
rollout area, cheapest class, big-rollout class, has a wide train (0/1), class share, least rollout
node-seconds, least node price, a wide candidate at or after it (0/1); and when every rollout
option is one node wide, their least busy time (else -1). ``tops[b, i, r]``: the sum of the ``r``
best gains of bound ``b`` (value; less area; less big class; share) among the candidates from ``i``
on. ``state[d]``: the group at depth ``d``, as ``per``'s first ten rows (sums, but the most cheapest
class and wide, the least price); ``member[d]``: its ``d``-th candidate (0: the leader); ``at[d]``:
the next candidate to try; ``trains[c, o]``: candidate ``c``'s training option ``o`` (``_lays_out``).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from weave_rl.planner.rules import TIME_TOL as TOL

BUSY, MEM, GAIN, AREA, CHEAPEST, BIG, WIDE, SHARE, SECONDS, UNIT, WIDE_AFTER, ONE_BUSY = range(12)
ROWS = 10  # ``state``'s sums


@numba.njit(cache=True)
def search(per: np.ndarray, tops: np.ndarray, trains: np.ndarray, state: np.ndarray, member: np.ndarray,
           at: np.ndarray, depth: int, fixed: float, limit: float, mem_cap: float, cap: float, bar: float, k: int,
           width: int, budget: int = 4000) -> tuple[int, int, bool]:
    """Go on from the group at ``depth`` (its candidates from ``at[depth]``): (the depth of the group
    returned, or -1 when the search is over; nodes visited; whether that group is a leaf to cost)."""
    n = per.shape[1] - 1
    visited = 0
    while depth >= 0 and visited < budget:
        s = state[depth]
        room = k - 1 - depth
        i = at[depth]
        child = -1
        if room > 0:
            left = room - 1
            base = fixed - s[GAIN]
            while i < n:
                if per[BUSY, i] > limit - s[BUSY] or per[MEM, i] > mem_cap + TOL - s[MEM]:
                    i += 1
                    continue  # most candidates
                if s[WIDE] == 0.0 and per[WIDE_AFTER, i] == 0.0:
                    break  # no wide job left: no group on this pool from here
                gain = s[GAIN] + per[GAIN, i]
                least = max(max(s[CHEAPEST], per[CHEAPEST, i]) - tops[0, i + 1, left],
                            s[AREA] + per[AREA, i] - tops[1, i + 1, left],
                            s[BIG] + per[BIG, i] - tops[2, i + 1, left])
                if fixed - gain + least >= bar or fixed - s[SHARE] - per[SHARE, i] - tops[3, i + 1, left] >= bar:
                    # No later candidate does better when even the ``room`` best values from here
                    # cannot pay for what the group holds already: the rest of the loop is cut.
                    if base + s[CHEAPEST] - tops[0, i, room] >= bar or base + s[AREA] - tops[1, i, room] >= bar \
                            or base + s[BIG] - tops[2, i, room] >= bar or fixed - s[SHARE] - tops[3, i, room] >= bar:
                        break
                    i += 1
                    continue
                child = i
                break
        if child < 0:
            depth -= 1  # this group's candidates are done
            continue
        at[depth] = child + 1
        depth += 1
        member[depth] = child
        at[depth] = child + 1
        t = state[depth]
        for r in range(ROWS):
            t[r] = s[r] + per[r, child]
        t[CHEAPEST] = max(s[CHEAPEST], per[CHEAPEST, child])
        t[WIDE] = max(s[WIDE], per[WIDE, child])
        t[UNIT] = min(s[UNIT], per[UNIT, child])
        visited += 1
        base = fixed - t[GAIN]
        if t[WIDE] > 0.0 and base + t[CHEAPEST] < bar and base + t[AREA] < bar and base + t[BIG] < bar \
                and fixed - t[SHARE] < bar and base + t[UNIT] * math.ceil((t[SECONDS] - TOL) / cap - 1e-9) < bar:
            if not _lays_out(trains, member[:depth + 1], width, cap + TOL + 1e-9, mem_cap + TOL):
                at[depth] = n  # no layout of the pool holds the group, nor one with more members
            elif not _too_many_bins(per, member[:depth + 1], cap, t[UNIT], bar - base):
                return depth, visited, True
    return depth, visited, False


@numba.njit(cache=True)
def _lays_out(trains: np.ndarray, group: np.ndarray, width: int, within: float, mem_cap: float) -> bool:
    """Whether the group's trains (``trains[c, o]``: nodes, duration, warm switch, host memory of
    candidate ``c``'s option ``o``; nodes 0 past its last) have some options and runs of the pool's
    nodes where every node's load (with the switches once shared) and memory fit: ``class_layout``'s
    test but for the widest member's width, so a group that fails here fails with more members too.
    Depth first over members, not recursive (numba's cache does not keep recursive functions)."""
    load = np.zeros((4, width))  # per node: busy time, switches, phases, memory
    tried = np.zeros(len(group), np.int64)  # per member: its (option, first node) pairs tried, in order
    placed = 0
    while 0 <= placed < len(group):
        step, fits = tried[placed], False
        while step < trains.shape[1] * width and not fits:
            span, d, sw, m = trains[group[placed], step // width]
            first, step = step % width, step + 1
            fits = 0 < span <= width - first
            for u in range(first, first + int(span) if fits else first):
                fits = fits and load[3, u] + m <= mem_cap and \
                    load[0, u] + d + (load[1, u] + sw if load[2, u] else 0.0) <= within
        tried[placed] = step
        if fits:
            load[:, first:first + int(span)] += np.array([d, sw, 1.0, m]).reshape(4, 1)
            placed += 1
            tried[placed:] = 0
            continue
        placed -= 1  # this member's choices are done: the one before moves on
        if placed >= 0:
            span, d, sw, m = trains[group[placed], (tried[placed] - 1) // width]
            first = (tried[placed] - 1) % width
            load[:, first:first + int(span)] -= np.array([d, sw, 1.0, m]).reshape(4, 1)
    return placed == len(group)


@numba.njit(cache=True)
def _too_many_bins(per: np.ndarray, group: np.ndarray, cap: float, price: float, budget: float) -> bool:
    """Whether the group's one-node rollouts need classes (bins) that cost ``budget`` at the least ``price``
    (most groups past the other floors on 300 RH jobs): other options are no smaller, other clusters' bins no fewer."""
    busy = per[ONE_BUSY][group]
    return busy.min() >= 0.0 and price * bins_floor(busy, cap) >= budget


@numba.njit(cache=True)
def bins_floor(busy: np.ndarray, cap: float) -> int:
    """Martello and Toth's L2: no fewer bins of capacity ``cap`` hold ``busy``. Members over half the cap
    take a bin each; for a size ``alpha`` of the others, those of at least ``alpha`` fill the room the
    big members leave them (none beside one that ``alpha`` would overflow), then bins of their own."""
    half, full = cap / 2 + TOL, cap + TOL
    best = big = np.sum(busy > half)
    for alpha in busy:
        if alpha > half:
            continue
        room, small = 0.0, 0.0
        for x in busy:
            if x > half and x + alpha <= full:
                room += full - x
            elif alpha <= x <= half:
                small += x
        best = max(best, big + math.ceil(max(0.0, small - room) / full - 1e-9))
    return best


@numba.njit(cache=True)
def suffix_tops(gains: np.ndarray, k: int) -> np.ndarray:
    """``out[b, i, r]``: the sum of the ``r`` largest positive gains of row ``b`` from ``i`` on (r = 0..k)."""
    out = np.zeros((gains.shape[0], gains.shape[1] + 1, k + 1))
    for b in range(gains.shape[0]):
        top = np.zeros(k)  # the k largest so far, descending (0: none)
        for i in range(gains.shape[1] - 1, -1, -1):
            x = gains[b, i]
            for r in range(k):  # x takes its place, the smaller ones move down
                if x > top[r]:
                    top[r], x = x, top[r]
            out[b, i, 1:] = np.cumsum(top)
    return out


def warm() -> None:
    """Compile the kernels for the types pricing passes (or load them from numba's cache) now, before
    a solve's clock starts: on a fresh install compiling took 10-25 s here, and a 30 s solve of 300
    Hetero jobs (s2) that paid it inside its limit ended 19.5 % above its bound (2.9 % once compiled)."""
    rows, ints = np.zeros((ROWS + 2, 1)), np.zeros(1, np.int64)
    search(rows, np.zeros((4, 1, 1)), np.zeros((1, 1, 4)), np.zeros((1, ROWS)), ints, ints, -1, *[0.0] * 5, 1, 1)
    bins_floor(np.zeros(1), 1.0)
    suffix_tops(np.zeros((1, 1)), 1)
