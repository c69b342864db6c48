"""Rollout shards on disk (the data flow of the local backend, and the samples in flight of the journal).

A rollout worker writes its ``Samples`` to ``DIR/samples/<job>/<iteration>/shard-<i>.pt`` (atomic
rename: a killed worker leaves no half file; a re-run writes the same samples, as rollouts are
deterministic). Every train worker of the iteration reads all shards, concatenates them in shard
order and takes its contiguous share of the rows.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from weave_rl.core.yamlio import atomic_write
from weave_rl.executor.workload import Samples


def shard_path(root: Path, job: str, iteration: int, shard: int) -> Path:
    return root / "samples" / job / str(iteration) / f"shard-{shard}.pt"


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temporary file renamed into place: a killed worker leaves no half file, a
    failed write no temporary one, and a full disk is reported as such (``OSError(ENOSPC)``)."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def save_samples(samples: Samples, path: Path) -> None:
    save_atomic({"job": samples.job, "iteration": samples.iteration, "shard": samples.shard,
                 "shards": samples.shards, "data": samples.data, "count": samples.count,
                 "tokens": samples.tokens, "ids": list(samples.ids), "stats": dict(samples.stats)}, path)


def load_samples(path: str | Path) -> Samples:
    d = torch.load(path, weights_only=True)
    return Samples(d["job"], d["iteration"], d["shard"], d["shards"], d["data"], d["count"], d["tokens"],
                   d["ids"], d["stats"])


def _pad_cat(tensors: list[torch.Tensor], left: bool = False) -> torch.Tensor:
    """Concatenate along dim 0, padding the other dims with zeros when they differ (on the left for
    left-padded columns such as GRPO's ``prompt_ids`` / ``prompt_mask``, else on the right)."""
    if len({t.shape[1:] for t in tensors}) > 1:
        dims = tensors[0].dim()
        size = [max(t.shape[d] for t in tensors) for d in range(1, dims)]
        padded = []
        for t in tensors:
            pad: list[int] = []
            for d in reversed(range(1, dims)):
                extra = size[d - 1] - t.shape[d]
                pad += [extra, 0] if left else [0, extra]
            padded.append(F.pad(t, pad))
        tensors = padded
    return torch.cat(tensors)


def merge(shards: list[Samples]) -> Samples:
    shards = sorted(shards, key=lambda s: s.shard)
    first = shards[0]
    keys = list(first.data)
    data = {k: _pad_cat([s.data[k] for s in shards], left=k.startswith("prompt")) for k in keys}
    count = sum(s.count for s in shards)
    stats: dict[str, float] = {}
    for k in {k for s in shards for k in s.stats}:
        vals = [(s.stats[k], s.count) for s in shards if k in s.stats]
        stats[k] = sum(v * c for v, c in vals) / max(1, sum(c for _, c in vals))
    return Samples(first.job, first.iteration, 0, 1, data, count, sum(s.tokens for s in shards),
                   [i for s in shards for i in s.ids], stats)


def split(samples: Samples, rank: int, parts: int) -> Samples:
    """Rows ``[rank * n / parts, (rank + 1) * n / parts)`` of a merged batch."""
    n = samples.count
    lo, hi = rank * n // parts, (rank + 1) * n // parts
    data = {k: v[lo:hi] for k, v in samples.data.items()}
    tokens = samples.tokens * (hi - lo) // max(1, n)
    return Samples(samples.job, samples.iteration, rank, parts, data, hi - lo, tokens, samples.ids[lo:hi],
                   dict(samples.stats))
