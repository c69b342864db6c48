"""GPU readiness check: one prepared run of the code paths that no CPU run reaches.

Run once on a CUDA machine, from the repository root (after ``pip install -e .``)::

    python bench/gpu_check.py --out gpu_check.json        # full sizes, < 8 minutes
    python bench/gpu_check.py --quick                     # small sizes: a dry run of the script
    python bench/gpu_check.py --quick --device cpu        # checks 2, 3 and 5 on CPU (gloo, plain copies)

Every check runs in its own child process under a time budget (a hung NCCL or vLLM call is killed,
not waited on); a global ``--deadline`` (default 450 s) skips what is left. Each row is ``ok``,
``failed: <one line>`` or ``skipped: <why>`` (no CUDA, no vLLM, one GPU for NCCL, ...). Exit 1 when a
check that ran failed, else 0. One table at the end, and the same rows as JSON with ``--out``.

Checks and their figures (GB/s = 1e9 bytes per second):

1. ``environment``: torch / CUDA / NCCL / vLLM versions, GPU names and memory (GiB).
2. ``pinned``: the warm switch's copies (``executor.local.tensor_state.move`` / ``offload``: one
   ``copy_(non_blocking=True)`` per tensor, then synchronize) of a pinned state dict of many params
   (``h2d_toy``, ``d2h_toy``), against one contiguous pinned buffer of the same size (``*_peak``: the
   copy engine's peak) and pageable host memory (``*_pageable``); ``*_ratio`` = toy / peak.
3. ``comm``: ``executor.local.comm`` between two spawned ranks: all-reduce of a float32 tensor
   (``ar_busbw`` = bytes / time x 2(n-1)/n, nccl-tests' bus bandwidth; ``ar_algbw`` = bytes / time),
   ``make_all_reduce`` correctness, and ``broadcast_weights`` of a state dict over gloo (the
   project's weight-sync path: ``bc_s``, ``bc_GBps``). NCCL needs one GPU per rank: with one GPU
   the all-reduce falls back to gloo on CUDA tensors and ``nccl`` says why it was skipped.
4. ``vllm``: the project's ``VLLMRollout`` through the GRPO workload (``engine: vllm``, tiny Llama):
   start, greedy decode, ``to_host`` (native ``sleep(level=2)``: ``freed_MiB`` of GPU memory),
   ``to_device`` (``wake_up`` + in-place reload), greedy again: identical tokens required; then
   other weights loaded in place (``load_weights``) and compared with torch's greedy (``swap_match``).
5. ``elastic``: two spawned processes share one iteration's 8 rollout shards from one queue; the
   second joins (``Workload.to_device`` from pinned host memory: ``join_switch_ms``) while the
   first generates. Required: every shard exactly once, and response ids and sampled tokens equal
   to a single-process run of all shards (``max_float_diff``: largest log-prob difference).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("environment", "pinned", "comm", "vllm", "elastic")
BUDGET_S = {"environment": 30, "pinned": 75, "comm": 100, "vllm": 220, "elastic": 100}
CPU_OK = {"environment", "pinned", "comm", "elastic"}  # what --device cpu runs
T0 = float(os.environ.setdefault("WEAVE_GPU_CHECK_T0", repr(time.time())))  # children count from the parent's start
GiB, MiB = 1 << 30, 1 << 20


# -- pure helpers --------------------------------------------------------------------------------------
def gbps(nbytes: float, seconds: float) -> float:
    """Bytes moved in ``seconds`` -> GB/s (1e9 bytes per second)."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def bus_bandwidth(nbytes: float, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algorithm bandwidth x 2(n-1)/n (GB/s)."""
    return gbps(nbytes, seconds) * 2 * (ranks - 1) / ranks


class RankFailed(RuntimeError):
    """A spawned rank's own one-line reason, passed on as it is."""


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    if isinstance(exc, RankFailed):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def say(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'check':<12} {'status':<8} {'time_s':>7}  figures / reason"]
    for r in rows:
        status, _, why = r["status"].partition(": ")
        figs = ", ".join(f"{k}={fmt(v)}" for k, v in r["figures"].items())
        lines.append(f"{r['check']:<12} {status:<8} {r['seconds']:>7.1f}  {why + ('; ' if why and figs else '')}{figs}")
    return "\n".join(lines)


def state_dict(total: int, pinned: bool) -> dict[str, Any]:
    """A model-like state dict of ~``total`` bytes (float32): per layer 4 square + 2 wide matrices + 2 norms
    (hidden 1024 from 1 GiB, else 256: some tens of params at least)."""
    import torch

    hidden = 1024 if total >= GiB else 256
    layer = 4 * hidden * hidden * 4 + 2 * hidden * 4 * hidden * 4 + 2 * hidden * 4
    shapes = {"embed": (hidden * 4, hidden)}
    for i in range(max(1, (total - hidden * hidden * 16) // layer)):
        shapes.update({f"l{i}.{n}": (hidden, hidden) for n in ("q", "k", "v", "o")})
        shapes.update({f"l{i}.up": (hidden, 4 * hidden), f"l{i}.down": (4 * hidden, hidden),
                       f"l{i}.n1": (hidden,), f"l{i}.n2": (hidden,)})
    return {k: torch.empty(s, pin_memory=pinned).fill_(0.5) for k, s in shapes.items()}


def nbytes_of(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def best_of(fn: Callable[[], None], reps: int, until: float) -> float:
    """Best seconds of ``reps`` calls (the first call warms up and is not counted), stopping at ``until``."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.monotonic() > until:
            break
    return best


# -- 1. environment --------------------------------------------------------------------------------------
def check_environment(args: argparse.Namespace, until: float) -> dict[str, Any]:
    figs: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        figs["weave_rl"] = importlib.metadata.version("weave_rl")
    except importlib.metadata.PackageNotFoundError:
        figs["weave_rl"] = "not installed (pip install -e .)"
    try:
        figs["vllm"] = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        figs["vllm"] = "missing"
    import torch

    figs.update(torch=torch.__version__, torch_cuda=torch.version.cuda or "none",
                cuda_available=torch.cuda.is_available(), gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for i in range(figs["gpus"]):
        p = torch.cuda.get_device_properties(i)
        figs[f"gpu{i}"] = p.name
        figs[f"gpu{i}_GiB"] = round(p.total_memory / GiB, 1)
    if figs["gpus"]:
        figs["gpu0_free_GiB"] = round(torch.cuda.mem_get_info(0)[0] / GiB, 1)
        try:
            v = torch.cuda.nccl.version()
            figs["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as exc:  # noqa: BLE001  a torch build without NCCL
            figs["nccl"] = f"missing ({one_line(exc)[:80]})"
    figs["cpus"] = os.cpu_count()
    return figs


# -- 2. pinned-memory warm switch --------------------------------------------------------------------------
def check_pinned(args: argparse.Namespace, until: float) -> dict[str, Any]:
    import torch

    from weave_rl.executor.local.tensor_state import move, offload

    cuda = args.device == "cuda"
    dev = torch.device("cuda:0" if cuda else "cpu")
    total = (256 * MiB if args.quick else 2 * GiB) if cuda else (64 * MiB if args.quick else 512 * MiB)
    reps = 2 if args.quick else 3
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    host = state_dict(total, pinned=cuda)
    n = nbytes_of(host)
    figs: dict[str, Any] = {"params": len(host), "GiB": round(n / GiB, 2)}
    say(f"pinned: {len(host)} params, {n / GiB:.2f} GiB {'pinned' if cuda else '(CPU: plain copies)'}")

    def h2d(state: dict[str, Any]) -> Callable[[], None]:
        def run() -> None:
            out = move(state, dev)
            sync()
            del out
        return run

    dev_state = move(host, dev)
    sync()
    figs["h2d_toy"] = gbps(n, best_of(h2d(host), reps, until))
    figs["d2h_toy"] = gbps(n, best_of(lambda: offload(dev_state, host), reps, until))
    # The copy engine's peak: one contiguous buffer of the same size, one copy each way.
    big_host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
    big_dev = torch.empty(n, dtype=torch.uint8, device=dev)
    figs["h2d_peak"] = gbps(n, best_of(lambda: (big_dev.copy_(big_host, non_blocking=True), sync()), reps, until))
    figs["d2h_peak"] = gbps(n, best_of(lambda: (big_host.copy_(big_dev, non_blocking=True), sync()), reps, until))
    figs["h2d_ratio"] = figs["h2d_toy"] / figs["h2d_peak"]
    figs["d2h_ratio"] = figs["d2h_toy"] / figs["d2h_peak"]
    if cuda:  # pageable host memory for contrast: the driver stages it through its own pinned buffer
        pageable = {k: torch.empty(t.shape, dtype=t.dtype).copy_(t) for k, t in host.items()}
        assert not any(t.is_pinned() for t in pageable.values())
        figs["h2d_pageable"] = gbps(n, best_of(h2d(pageable), reps, until))
        figs["d2h_pageable"] = gbps(n, best_of(lambda: offload(dev_state, pageable), reps, until))
    back = offload(dev_state, {k: torch.empty(t.shape, dtype=t.dtype) for k, t in host.items()})
    if not all(torch.equal(back[k], host[k]) for k in host):
        raise RuntimeError("a round trip through the device changed the state")
    return figs


# -- 3. comm: all-reduce and weight broadcast between two processes --------------------------------------------
def _comm_rank(rank: int, size: int, backend: str, device: str, rdv: str, ar_bytes: int, bc_bytes: int,
               iters: int, out: Any) -> None:
    try:
        import torch

        from weave_rl.executor.local.comm import Groups, broadcast_weights, make_all_reduce
        from weave_rl.executor.local.messages import Group

        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        groups = Groups(rdv, "127.0.0.1", dev)
        pg = groups.get(Group(f"ar-{backend}", size, rank), nccl=backend == "nccl")
        reduce = make_all_reduce(pg, size)  # the train phase's path: average of a list of tensors
        grads = [torch.full((1000, 10), float(rank + 1), device=dev), torch.full((7,), float(rank + 1), device=dev)]
        reduce(grads)
        sync()
        want = (size + 1) / 2
        if not all(bool((g == want).all()) for g in grads):
            raise RuntimeError(f"make_all_reduce gave {float(grads[0].flatten()[0])}, expected {want}")
        x = torch.ones(ar_bytes // 4, device=dev)
        pg.allreduce([x]).wait()  # warm-up: NCCL builds its communicator on the first call
        sync()
        t = time.perf_counter()
        for _ in range(iters):
            pg.allreduce([x]).wait()
        sync()
        ar_s = (time.perf_counter() - t) / iters
        # Weight sync: the project's broadcast_weights over a gloo group, CPU tensors.
        wg = groups.get(Group("weights", size, rank))
        weights = state_dict(bc_bytes, pinned=False) if rank == 0 else None
        wg.allreduce([torch.zeros(1)]).wait()  # both ranks at the start line
        t = time.perf_counter()
        got, nbytes = broadcast_weights(wg, weights)
        bc_s = time.perf_counter() - t
        if not (got and all(bool((v == 0.5).all()) for v in got.values())):
            raise RuntimeError("broadcast_weights delivered other values")
        out.put((rank, {"ar_s": ar_s, "bc_s": bc_s, "bc_bytes": nbytes, "params": len(got)}))
    except BaseException as exc:  # noqa: BLE001  reported by the parent as the check's reason
        out.put((rank, one_line(exc)))


def _run_ranks(target: Callable[..., None], argsets: list[tuple], timeout: float) -> list[Any]:
    """Spawn one process per argset (the last arg is the result queue), collect one result each."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, out), daemon=True) for a in argsets]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    end = time.monotonic() + timeout
    try:
        while len(results) < len(procs):
            rank, res = out.get(timeout=max(0.1, end - time.monotonic()))
            results[rank] = res
    except queue.Empty:
        raise TimeoutError(f"ranks {sorted(set(range(len(procs))) - set(results))} gave no result in {timeout:.0f} s") from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [results[i] for i in range(len(procs))]


def check_comm(args: argparse.Namespace, until: float) -> dict[str, Any]:
    import torch

    cuda = args.device == "cuda"
    ar_bytes = (16 if args.quick else 256) * MiB
    bc_bytes = (32 if args.quick else 500) * 10**6
    gpus = torch.cuda.device_count() if cuda else 0
    figs: dict[str, Any] = {}
    if not cuda:
        attempts = [("gloo", ["cpu", "cpu"])]
        figs["nccl"] = "skipped: --device cpu"
    elif gpus >= 2:
        attempts = [("nccl", ["cuda:0", "cuda:1"])]
    else:  # NCCL refuses two ranks on one device ("Duplicate GPU detected"): try, then gloo on CUDA tensors
        attempts = [("nccl", ["cuda:0", "cuda:0"]), ("gloo", ["cuda:0", "cuda:0"])]
    for backend, devices in attempts:
        remaining = until - time.monotonic()
        timeout = min(30.0, remaining / 2) if backend == "nccl" and len(attempts) > 1 else remaining - 2
        say(f"comm: {backend} on {'+'.join(devices)} ({ar_bytes // MiB} MiB all-reduce, {bc_bytes / 1e6:.0f} MB broadcast)")
        with tempfile.TemporaryDirectory(prefix="weave-gpucheck-") as tmp:
            rdv = os.path.join(tmp, "rendezvous")
            sets = [(r, 2, backend, d, rdv, ar_bytes, bc_bytes, 3 if args.quick else 10) for r, d in enumerate(devices)]
            try:
                res = _run_ranks(_comm_rank, sets, timeout)
                bad = [r for r in res if isinstance(r, str)]
                if bad:
                    raise RankFailed(bad[0])
            except Exception as exc:  # noqa: BLE001
                if backend == "nccl" and len(attempts) > 1:
                    figs["nccl"] = f"skipped: one GPU (NCCL needs one device per rank): {one_line(exc)[:120]}"
                    continue
                raise
        ar_s, bc_s = max(r["ar_s"] for r in res), max(r["bc_s"] for r in res)
        figs.update(backend=backend, devices="+".join(devices), ar_MiB=ar_bytes // MiB, ar_ms=ar_s * 1e3,
                    ar_algbw=gbps(ar_bytes, ar_s), ar_busbw=bus_bandwidth(ar_bytes, ar_s, 2),
                    bc_MB=res[0]["bc_bytes"] / 1e6, bc_params=res[0]["params"], bc_s=bc_s,
                    bc_GBps=gbps(res[0]["bc_bytes"], bc_s))
        if backend == "nccl":
            figs["nccl"] = "ok"
        break
    return figs


# -- 4. vLLM sleep / wake / in-place reload --------------------------------------------------------------------
def check_vllm(args: argparse.Namespace, until: float) -> dict[str, Any]:
    import torch

    from weave_rl.executor.rl.vllm_engine import vllm_missing

    why = vllm_missing()
    if why:
        raise SkipCheck(why[:200])
    from weave_rl.executor.rl import GRPOWorkload
    from weave_rl.executor.rl.model import build_model, initial_params
    from weave_rl.executor.rl.vllm_engine import greedy_torch

    dev = torch.device("cuda:0")
    # Head size 32 (hidden 64 / 2 heads): what the CPU tests use, so the same job runs on both.
    w = GRPOWorkload("V", {"engine": "vllm", "heads": 2, "model": args.vllm_model, "group_size": 4,
                           "prompts_per_iteration": 4, "max_new_tokens": 16}, 7)
    prompt, steps, eos = w._prompt_tokens(w.problem(0, 0)), w.max_new_tokens, w.tokenizer.eos_id  # fits the engine's shape
    figs: dict[str, Any] = {"model": args.vllm_model}
    t = time.perf_counter()
    w.to_device("rollout", w.initial_state("rollout"), dev)
    eng = w.rollout_engine
    figs.update(start_s=time.perf_counter() - t, native_sleep=eng.native_sleep)
    say(f"vllm: engine up in {figs['start_s']:.1f} s (native sleep mode: {eng.native_sleep})")
    first = eng.greedy(prompt, steps, eos)
    samples = w.rollout(0, 0, 1)
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info(dev)[0]
    t = time.perf_counter()
    host = w.to_host("rollout")  # sleep(level=2): weights discarded, KV cache freed
    figs["sleep_s"] = time.perf_counter() - t
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # without native sleep the freed KV cache would stay in torch's cache
    figs["freed_MiB"] = (torch.cuda.mem_get_info(dev)[0] - free0) / MiB
    t = time.perf_counter()
    w.to_device("rollout", host, dev)  # wake_up(weights) + in-place reload from the host copy + wake_up(kv_cache)
    figs["wake_s"] = time.perf_counter() - t
    again = eng.greedy(prompt, steps, eos)
    figs["same_after_wake"] = again == first
    figs["sampled_same"] = torch.equal(w.rollout(0, 0, 1).data["response_ids"], samples.data["response_ids"])
    # Other weights, loaded in place; a sharpened head gives greedy clear margins to compare with torch.
    other = initial_params(w.opts, w.tokenizer, 8)
    other["lm_head.weight"] = other["lm_head.weight"] * 30
    t = time.perf_counter()
    eng.load_weights(other)
    figs["reload_ms"] = (time.perf_counter() - t) * 1e3
    model = build_model(w.opts, w.tokenizer, w.seed)
    model.load_state_dict(other)
    want, gap = greedy_torch(model, prompt, steps, eos)
    figs.update(swap_match=eng.greedy(prompt, steps, eos) == want, swap_gap=gap)
    eng.load_weights({n[len("policy."):]: t for n, t in host.items()})
    figs["same_after_reload"] = eng.greedy(prompt, steps, eos) == first
    eng.close()
    if not (figs["same_after_wake"] and figs["same_after_reload"]):
        raise RuntimeError(f"greedy tokens changed with the same weights ({figs})")
    if figs["freed_MiB"] <= 0 and eng.native_sleep:
        raise RuntimeError(f"sleep(level=2) freed no GPU memory ({figs['freed_MiB']:.1f} MiB)")
    return figs


# -- 5. elastic rollout growing onto a second process ------------------------------------------------------------
def _digest(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """sha256 of the integer/bool tensors (sampled tokens, masks) and the float tensors kept for a diff."""
    h = hashlib.sha256()
    floats = {}
    for k in sorted(data):
        t = data[k]
        if t.is_floating_point():
            floats[k] = t.double().numpy()  # numpy: a torch tensor would cross the queue as a shared fd
        else:
            h.update(k.encode() + t.contiguous().numpy().tobytes())
    return h.hexdigest(), floats


def _elastic_rank(rank: int, block: dict[str, Any], device: str, shards: int, work: Any, ready: Any, go: Any,
                  out: Any) -> None:
    try:
        import torch

        from weave_rl.executor.workload import build_workload

        torch.set_num_threads(1)
        dev = torch.device(device)
        w = build_workload("E", block, default_seed=3)
        state = w.initial_state("rollout")
        if dev.type == "cuda":  # the worker's host copy is pinned; its CUDA context exists before the switch
            state = {k: v.pin_memory() for k, v in state.items()}
            torch.zeros(1, device=dev)
        ready.set()
        go.wait()
        t = time.perf_counter()
        w.to_device("rollout", state, dev)
        switch = time.perf_counter() - t
        shares = []
        while (shard := work.get()) is not None:
            s = w.rollout(0, shard, shards)
            shares.append((shard, s.ids, *_digest(s.data)))
            out.put(("share", rank, shard))
        out.put((rank, {"switch_s": switch, "shares": shares}))
    except BaseException as exc:  # noqa: BLE001
        out.put((rank, one_line(exc)))


def check_elastic(args: argparse.Namespace, until: float) -> dict[str, Any]:
    import multiprocessing as mp

    import torch

    from weave_rl.executor.workload import build_workload

    device = "cuda:0" if args.device == "cuda" else "cpu"
    shards = 8
    block = {"kind": args.workload}
    block.update({"prompts_per_iteration": 16, "group_size": 4, "threads": 1} if args.workload == "grpo" else {"batch": 64})
    ctx = mp.get_context("spawn")
    work, out = ctx.Queue(), ctx.Queue()
    for s in list(range(shards)) + [None, None]:  # one stop mark per process
        work.put(s)
    ready, go = [ctx.Event(), ctx.Event()], [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_elastic_rank, args=(r, block, device, shards, work, ready[r], go[r], out), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for e in ready:  # both processes up, their host state built; only the first holds the device
            if not e.wait(timeout=max(1.0, until - time.monotonic())):
                raise TimeoutError("a rollout process did not start in time")
        say(f"elastic: {args.workload} on {device}: process 0 starts on {shards} shards, process 1 joins after its first")
        go[0].set()
        while len(results) < 2:
            msg = out.get(timeout=max(0.1, until - time.monotonic()))
            if msg[0] == "share":
                go[1].set()  # the first share is done: grow onto the second process
            else:
                results[msg[0]] = msg[1]
                go[1].set()
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    bad = [r for r in results.values() if isinstance(r, str)]
    if bad:
        raise RankFailed(bad[0])
    # The reference: one process generates every shard.
    torch.set_num_threads(1)
    ref_w = build_workload("E", block, default_seed=3)
    ref_w.to_device("rollout", ref_w.initial_state("rollout"), torch.device(device))
    ref = {}
    for s in range(shards):
        r = ref_w.rollout(0, s, shards)
        ref[s] = (r.ids, *_digest(r.data))
    got = [sh for r in (0, 1) for sh in results[r]["shares"]]
    seen = sorted(sh[0] for sh in got)
    figs: dict[str, Any] = {"workload": args.workload, "shares_p0": len(results[0]["shares"]),
                            "shares_p1": len(results[1]["shares"]),
                            "join_switch_ms": results[1]["switch_s"] * 1e3, "first_switch_ms": results[0]["switch_s"] * 1e3}
    ids = sorted(i for sh in got for i in sh[1])
    figs["ids_equal"] = ids == sorted(i for v in ref.values() for i in v[0])
    figs["tokens_equal"] = all(ref[sh[0]][1] == sh[2] for sh in got)
    figs["max_float_diff"] = max((float(abs(ref[sh[0]][2][k] - v).max()) for sh in got for k, v in sh[3].items()
                                  if v.size), default=0.0)
    if seen != list(range(shards)):
        raise RuntimeError(f"shards not run exactly once: {seen}")
    if not (figs["ids_equal"] and figs["tokens_equal"]):
        raise RuntimeError(f"the two-process rollout differs from a single-process run ({figs})")
    if figs["shares_p1"] == 0:
        figs["note"] = "joiner got no share (first process finished before it switched)"
    return figs


# -- driver -----------------------------------------------------------------------------------------------------
class SkipCheck(Exception):
    """The check cannot run here; the message is the reason."""


RUNNERS: dict[str, Callable[[argparse.Namespace, float], dict[str, Any]]] = {
    "environment": check_environment, "pinned": check_pinned, "comm": check_comm, "vllm": check_vllm,
    "elastic": check_elastic}


def run_child(args: argparse.Namespace) -> int:
    """In the child process: run one check, write its row to ``--child-out``."""
    name, t = args.child, time.monotonic()
    try:
        figs, status = RUNNERS[name](args, time.monotonic() + args.budget), "ok"
    except SkipCheck as exc:
        figs, status = {}, f"skipped: {exc}"
    except BaseException as exc:  # noqa: BLE001
        traceback.print_exc()  # the one-line reason goes in the table; the whole story to stderr
        figs, status = {}, f"failed: {one_line(exc)}"
    row = {"check": name, "status": status, "seconds": time.monotonic() - t, "figures": figs}
    Path(args.child_out).write_text(json.dumps(row, default=str))
    return 0


def precheck(name: str, args: argparse.Namespace, env: dict[str, Any]) -> str | None:
    """Why ``name`` is skipped before any process starts (None: run it)."""
    if args.device == "cpu":
        return None if name in CPU_OK else "needs CUDA (--device cpu)"
    if not env.get("cuda_available"):
        return f"CUDA not available (torch {env.get('torch', '?')}, CUDA build {env.get('torch_cuda', '?')})"
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install vllm)"
    return None


def run_one(name: str, args: argparse.Namespace, budget: float) -> dict[str, Any]:
    """Run a check in a child process of its own session; kill the whole group past ``budget``."""
    with tempfile.TemporaryDirectory(prefix="weave-gpucheck-") as tmp:
        row_file = os.path.join(tmp, "row.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--child-out", row_file,
               "--budget", f"{budget:.1f}", "--device", args.device, "--workload", args.workload,
               "--vllm-model", args.vllm_model] + (["--quick"] if args.quick else [])
        t = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=budget + 10)  # the check watches its own budget; this catches a hang
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"check": name, "status": f"failed: timed out after {budget:.0f} s (killed)",
                    "seconds": time.monotonic() - t, "figures": {}}
        if os.path.exists(row_file):
            return json.loads(Path(row_file).read_text())
        return {"check": name, "status": f"failed: the check's process exited {proc.returncode} without a result",
                "seconds": time.monotonic() - t, "figures": {}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the rows as JSON to this file")
    ap.add_argument("--quick", action="store_true", help="small sizes: a dry run of the script")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: run checks 2, 3 and 5 on CPU")
    ap.add_argument("--deadline", type=float, default=450.0, help="seconds; checks not started by then are skipped")
    ap.add_argument("--only", help="comma-separated checks to run (the others are skipped)")
    ap.add_argument("--workload", choices=("grpo", "bandit"), default="grpo", help="check 5's workload kind")
    ap.add_argument("--vllm-model", default="tiny", help="check 4's model: tiny or smollm2")
    ap.add_argument("--child", choices=CHECKS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args)
    sys.path.insert(0, str(ROOT))
    only = set(args.only.split(",")) if args.only else set(CHECKS)
    rows: list[dict[str, Any]] = []
    env: dict[str, Any] = {}
    for name in CHECKS:
        left = args.deadline - (time.time() - T0)
        why = precheck(name, args, env) if name != "environment" else None
        if name not in only and name != "environment":  # the environment decides what the others can do
            why = "not in --only"
        elif left < 5 and name != "environment":
            why = f"global deadline of {args.deadline:.0f} s reached"
        if why:
            row = {"check": name, "status": f"skipped: {why}", "seconds": 0.0, "figures": {}}
        elif name == "environment":  # in this process: it decides what the others can do
            t = time.monotonic()
            try:
                env = check_environment(args, 0.0)
                row = {"check": name, "status": "ok", "seconds": time.monotonic() - t, "figures": env}
            except Exception as exc:  # noqa: BLE001
                row = {"check": name, "status": f"failed: {one_line(exc)}", "seconds": time.monotonic() - t, "figures": {}}
        else:
            budget = min(BUDGET_S[name] * (0.5 if args.quick else 1.0), left - 3)
            say(f"{name}: start (budget {budget:.0f} s)")
            row = run_one(name, args, budget)
        rows.append(row)
        say(f"{name}: {row['status'].split(': ')[0] if len(row['status']) > 60 else row['status']} ({row['seconds']:.1f} s)")
    total = time.time() - T0
    print(table(rows), flush=True)
    print(f"total {total:.1f} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "total_s": total, "device": args.device,
                                              "quick": args.quick}, indent=2, default=str) + "\n")
    return 1 if any(r["status"].startswith("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
