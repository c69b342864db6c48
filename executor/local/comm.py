"""torch.distributed inside the workers: groups on demand, weight packing, the train all-reduce.

There is no global world: every group is its own ``ProcessGroupGloo`` (NCCL for train groups on
CUDA) over a ``PrefixStore`` of the run's rendezvous store, built by its members the first time
they use it and kept for the life of the worker. A group's name carries the incarnation of each
member, so a restarted worker gets fresh groups and the survivors never wait on a dead peer's.

Security: the rendezvous store is a ``FileStore`` in the run folder (``.rendezvous/``, mode 0700), not
a TCP listener: only the user who owns the run can read or write its keys, and nothing listens for
it. Gloo's own pair listeners bind to ``bind_host`` (127.0.0.1 unless the workers span machines).
Weights cross the channel as raw bytes behind a JSON header: nothing read from it is unpickled.
"""

from __future__ import annotations

import datetime
import json
import threading

import torch
import torch.distributed as dist

from weave_rl.executor.local.messages import Group

TIMEOUT = datetime.timedelta(seconds=60)  # also bounds a rendezvous with a peer that died first


class Groups:
    def __init__(self, rendezvous: str, bind_host: str, device: torch.device):
        """``rendezvous``: the FileStore's path; ``bind_host``: the address gloo listens on ("" = this
        machine's default interface, for workers on several machines)."""
        self.store = dist.FileStore(rendezvous, -1)
        self.device = device
        self.bind_host = bind_host
        self.cache: dict[str, object] = {}
        self.lock = threading.Lock()

    def get(self, spec: Group, *, nccl: bool = False):
        with self.lock:
            pg = self.cache.get(spec.name)
        if pg is not None:
            return pg
        store = dist.PrefixStore(spec.name, self.store)
        if nccl:
            opts = dist.ProcessGroupNCCL.Options()
            pg = dist.ProcessGroupNCCL(store, spec.rank, spec.size, opts)
        else:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = TIMEOUT
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self.bind_host) if self.bind_host
                             else dist.ProcessGroupGloo.create_default_device()]
            pg = dist.ProcessGroupGloo(store, spec.rank, spec.size, opts)
        with self.lock:
            self.cache[spec.name] = pg
        return pg


def make_all_reduce(pg, size: int):
    """In-place average of a list of tensors over the group (one flat buffer per call)."""

    def all_reduce(tensors: list[torch.Tensor]) -> None:
        if size <= 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        pg.allreduce([flat]).wait()
        flat /= size
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n

    return all_reduce


def pack(weights: dict[str, torch.Tensor]) -> tuple[bytes, torch.Tensor]:
    """A header (names, dtypes, shapes) and one flat uint8 buffer of all the bytes."""
    names = sorted(weights)
    header = [(k, str(weights[k].dtype).removeprefix("torch."), tuple(weights[k].shape)) for k in names]
    parts = [weights[k].detach().contiguous().cpu().reshape(-1).view(torch.uint8) for k in names]
    flat = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
    return json.dumps(header).encode(), flat


def unpack(header: bytes, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    offset = 0
    for name, dtype, shape in json.loads(header):
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"weight sync header names no torch dtype: {dtype!r}")
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dt).element_size()
        out[name] = flat[offset:offset + n].view(dt).reshape(shape).clone()
        offset += n
    return out


def broadcast_weights(pg, weights: dict[str, torch.Tensor] | None) -> tuple[dict[str, torch.Tensor], int]:
    """Rank 0 sends ``weights`` to every member (size, header, payload); returns them and the bytes."""
    if weights is not None:
        header, flat = pack(weights)
        sizes = torch.tensor([len(header), flat.numel()], dtype=torch.int64)
    else:
        sizes = torch.zeros(2, dtype=torch.int64)
    pg.broadcast(sizes, 0).wait()
    h = torch.frombuffer(bytearray(header), dtype=torch.uint8) if weights is not None \
        else torch.empty(int(sizes[0]), dtype=torch.uint8)
    pg.broadcast(h, 0).wait()
    if weights is None:
        flat = torch.empty(int(sizes[1]), dtype=torch.uint8)
    pg.broadcast(flat, 0).wait()
    if weights is not None:
        return weights, flat.numel()
    return unpack(bytes(h.numpy()), flat), flat.numel()
