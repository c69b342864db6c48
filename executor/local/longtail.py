"""``longtail``: a real RL job whose responses end at EOS with heavy-tailed lengths (long-tail rollouts).

What it is for: in real RL jobs with 8K-32K token responses a rollout's prompt groups take very
different times, so a share's time is its longest response's (the long tail that long-tail
migration moves off the GPUs that leave). This kind reproduces that on real worker processes with
a small, fast policy: real autoregressive decoding, step by step, until every response of the
share has hit EOS, and real policy-gradient training.

The task. A prompt is a target length ``L`` plus ``CONTEXT`` context tokens, drawn from the prompt's
own seed ``(seed, iteration, prompt index)`` only (never from the shard count: prompt ``p`` is the same
prompt however the iteration is sharded). ``L = round(exp(mu + len_sigma * z))``, a lognormal whose
(uncapped) mean is ``mean_len``, capped to ``[1, max_new_tokens]``. A response is a token sequence
that ends with EOS (token 0) or at ``max_new_tokens``; its reward is the length match
``1 - min(1, |len - L| / L)``, ``len`` counting the EOS.

The policy. Token embeddings, a GRU cell over ``[embedding of the previous token, position
features]`` whose initial state encodes the context tokens and ``log L``, and two heads: a stop head
(``P(EOS) = sigmoid(stop logit)``, a learned linear function of the hidden state and of the position
features, among them ``r = (t + 1 - L) / L``) and a token head (softmax over the ``vocab - 1`` other
tokens, taken when not stopping). The stop head starts "as if SFT'd": its weight on ``r`` makes the
hazard low before ``L`` and high after, so response lengths track the heavy-tailed targets from
iteration 0 (about +-10-20 % of ``L``); training sharpens it. Log-probabilities are differentiable
in every parameter.

Rollout: the iteration has ``prompts`` prompts of ``group`` responses each (GRPO prompt groups);
shard ``s`` of ``S`` gets a contiguous share of whole prompts (``prompts // S``, one more for the first
``prompts % S`` shards; an empty share returns 0 samples with the same columns). Every response has
its own generator seeded from ``(seed, iteration, prompt, response)``; the share is decoded as one
batch, a real forward pass per step (``step_repeat`` times, to make steps costlier in benchmarks),
``check_cancelled()`` between steps, until every response has ended. Reward adds the group-normalised
advantage (``(r - group mean) / (group std + 1e-4)``, computed on the rollout worker, where groups are
whole). Train: GRPO's clipped token-level loss (PPO ratio against the rollout's log-probs, clip
0.2, mean over the batch's response tokens), ``epochs`` passes, gradients averaged with
``all_reduce``, a hand-written Adam on the train state (moved like every other state tensor).

Options (defaults)::

    prompts: 16          prompts per iteration
    group: 4             responses per prompt (a GRPO group; 1 gives zero advantages)
    mean_len: 24.0       mean of the (uncapped) lognormal target length
    len_sigma: 1.0       its log-space standard deviation (0: every target is round(mean_len))
    max_new_tokens: 256  cap on target and response lengths
    hidden: 64           GRU width
    vocab: 16            tokens, EOS included
    step_repeat: 1       forward passes per decoding step
    epochs: 1            passes of train over its samples
    lr: 0.01             Adam learning rate

Jobs file::

    workload: {kind: longtail, prompts: 16, group: 4, mean_len: 24, len_sigma: 1.0, max_new_tokens: 256}

State movement and weight sync are ``tensor_state.TensorStateWorkload``'s (as ``bandit``'s): real copies,
host copies pinned on CUDA, weights synced before the rollout state exists applied by the next
``to_device``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import torch

from weave_rl.executor.local.tensor_state import TensorStateWorkload, adam_step
from weave_rl.executor.prompt_groups import mix_seed, shard_prompts
from weave_rl.executor.workload import AllReduce, OptionError, Samples, phase, register_workload

EOS = 0
CONTEXT = 4  # context tokens per prompt
POSITION_FEATURES = 3  # r = (t + 1 - L) / L, (t + 1) / max_new_tokens, 1
SHARPNESS = 10.0  # the stop head's initial weight on r: hazard 0.5 at len == L, ~0.12 at 0.8 L, ~0.88 at 1.2 L
CLIP = 0.2
ADV_EPS = 1e-4
PARAMS = ("emb", "w_c", "w_l", "b0", "w_ih", "b_ih", "w_hh", "b_hh", "w_o", "b_o", "w_s", "a_s", "b_s")
STREAM_PROMPT, STREAM_SAMPLE, STREAM_INIT = 1, 2, 3

DEFAULTS: dict[str, Any] = {"prompts": 16, "group": 4, "mean_len": 24.0, "len_sigma": 1.0, "max_new_tokens": 256,
                            "hidden": 64, "vocab": 16, "step_repeat": 1, "epochs": 1, "lr": 0.01}
# option -> (type, lowest, highest); ints exclude bools, floats accept ints
_RANGES: dict[str, tuple[type, float, float]] = {
    "prompts": (int, 1, 1_000_000), "group": (int, 1, 10_000), "mean_len": (float, 1.0, 1e6),
    "len_sigma": (float, 0.0, 5.0), "max_new_tokens": (int, 1, 1_000_000), "hidden": (int, 1, 65_536),
    "vocab": (int, 2, 1_000_000), "step_repeat": (int, 1, 10_000), "epochs": (int, 1, 1_000),
    "lr": (float, 0.0, 10.0)}

def _check(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options with defaults filled in; ``OptionError`` for the first bad one."""
    for key in options:
        if key not in DEFAULTS:
            raise OptionError(key, f"unknown longtail option (known: {', '.join(DEFAULTS)})")
    out = dict(DEFAULTS)
    for key, value in options.items():
        kind, lo, hi = _RANGES[key]
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise OptionError(key, f"must be {'a number' if kind is float else 'an integer'}, got {value!r}")
        if kind is float and not math.isfinite(value):
            raise OptionError(key, f"must be finite, got {value!r}")
        low_ok = value > lo if key == "lr" else value >= lo
        if not low_ok or value > hi:
            low = f"> {lo:g}" if key == "lr" else f">= {lo:g}"
            raise OptionError(key, f"must be {low} and <= {hi:g}, got {value!r}")
        out[key] = kind(value)
    return out


@register_workload("longtail")
class LongTail(TensorStateWorkload):
    PARAMS = PARAMS
    kind = "longtail"

    def __init__(self, job: str, options: Mapping[str, Any], seed: int) -> None:
        super().__init__(job, options, seed)
        o = _check(self.options)
        self.prompts: int = o["prompts"]
        self.group: int = o["group"]
        self.mean_len: float = o["mean_len"]
        self.len_sigma: float = o["len_sigma"]
        self.max_new_tokens: int = o["max_new_tokens"]
        self.hidden: int = o["hidden"]
        self.vocab: int = o["vocab"]
        self.step_repeat: int = o["step_repeat"]
        self.epochs: int = o["epochs"]
        self.lr: float = o["lr"]

    @classmethod
    def check_options(cls, options: Mapping[str, Any], base: Path) -> None:
        """Types and ranges of every option, unknown keys refused (``OptionError`` naming the key)."""
        _check(options)
        return None

    # -- prompts -------------------------------------------------------------------------------
    def prompt(self, iteration: int, prompt: int) -> tuple[int, list[int]]:
        """``(L, context tokens)`` of prompt ``prompt`` of ``iteration``: depends on (seed, iteration, prompt) only."""
        g = torch.Generator().manual_seed(mix_seed(self.seed, iteration, prompt, STREAM_PROMPT))
        z = float(torch.randn((), generator=g, dtype=torch.float64))
        mu = math.log(self.mean_len) - self.len_sigma ** 2 / 2
        length = min(self.max_new_tokens, max(1, round(math.exp(min(mu + self.len_sigma * z, 700.0)))))
        context = torch.randint(1, self.vocab, (CONTEXT,), generator=g).tolist() if self.vocab > 1 else [0] * CONTEXT
        return length, context

    # -- state ---------------------------------------------------------------------------------
    def fresh_params(self) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(mix_seed(self.seed, STREAM_INIT))
        h, v, f = self.hidden, self.vocab, POSITION_FEATURES
        a_s = torch.zeros(f)
        a_s[0] = SHARPNESS
        return {"emb": torch.randn(v, h, generator=g) / h ** 0.5,
                "w_c": torch.randn(h, h, generator=g) / h ** 0.5,
                "w_l": torch.randn(2, h, generator=g) / 2 ** 0.5,
                "b0": torch.zeros(h),
                "w_ih": torch.randn(h + f, 3 * h, generator=g) / (h + f) ** 0.5,
                "b_ih": torch.zeros(3 * h),
                "w_hh": torch.randn(h, 3 * h, generator=g) / h ** 0.5,
                "b_hh": torch.zeros(3 * h),
                "w_o": torch.randn(h, max(1, v - 1), generator=g) / h ** 0.5,
                "b_o": torch.zeros(max(1, v - 1)),
                "w_s": torch.randn(h, generator=g) * (0.1 / h ** 0.5),
                "a_s": a_s,
                "b_s": torch.zeros(())}

    # -- the policy ----------------------------------------------------------------------------
    def _h0(self, p: Mapping[str, torch.Tensor], context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Initial hidden state from the context tokens and log L, (n, hidden)."""
        ctx = p["emb"][context].mean(1)  # (n, h)
        lfeat = torch.stack([torch.log(target.float()) / math.log(self.max_new_tokens + 1.0),
                             torch.ones_like(target, dtype=torch.float32)], 1).to(ctx.dtype)
        return torch.tanh(ctx @ p["w_c"] + lfeat @ p["w_l"] + p["b0"])

    def _features(self, t: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Position features of emitting token ``t`` (0-based; broadcasting), ``(..., POSITION_FEATURES)``."""
        lf = target.float()
        tf = (t + 1).float()
        r = (tf - lf) / lf
        return torch.stack([r, tf / self.max_new_tokens, torch.ones_like(r)], -1)

    def _gates_in(self, p: Mapping[str, torch.Tensor], prev: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return torch.cat([p["emb"][prev], feat], -1) @ p["w_ih"] + p["b_ih"]

    def _cell(self, p: Mapping[str, torch.Tensor], gi: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One GRU step given the input gates ``gi`` (n, 3h)."""
        gh = h @ p["w_hh"] + p["b_hh"]
        ir, iz, in_ = gi.chunk(3, -1)
        hr, hz, hn = gh.chunk(3, -1)
        r = torch.sigmoid(ir + hr)
        z = torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        return (1 - z) * n + z * h

    def _heads(self, p: Mapping[str, torch.Tensor], h: torch.Tensor, feat: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(stop logit (n,), token log-probs over the non-EOS tokens (n, vocab - 1))."""
        stop = h @ p["w_s"] + feat @ p["a_s"] + p["b_s"]
        return stop, torch.log_softmax(h @ p["w_o"] + p["b_o"], -1)

    def _logp(self, p: Mapping[str, torch.Tensor], stop: torch.Tensor, tok_logp: torch.Tensor,
              token: torch.Tensor) -> torch.Tensor:
        """Log-probability of ``token`` (EOS: log sigmoid(stop); else log(1 - sigmoid(stop)) + token log-prob)."""
        other = tok_logp.gather(-1, (token - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return torch.where(token == EOS, torch.nn.functional.logsigmoid(stop),
                           torch.nn.functional.logsigmoid(-stop) + other)

    def sequence_logp(self, p: Mapping[str, torch.Tensor], context: torch.Tensor, target: torch.Tensor,
                      tokens: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs (n, T) of the given responses under ``p`` (teacher forcing, differentiable)."""
        n, steps = tokens.shape
        h = self._h0(p, context, target)
        prev = torch.cat([torch.full((n, 1), EOS, dtype=tokens.dtype, device=tokens.device), tokens[:, :-1]], 1)
        t = torch.arange(steps, device=tokens.device)
        feat = self._features(t[None, :].expand(n, steps), target[:, None].expand(n, steps))  # (n, T, F)
        gi = self._gates_in(p, prev, feat)  # (n, T, 3h): all input gates at once
        out = []
        for step in range(steps):
            h = self._cell(p, gi[:, step], h)
            stop, tok_logp = self._heads(p, h, feat[:, step])
            out.append(self._logp(p, stop, tok_logp, tokens[:, step]))
        return torch.stack(out, 1) if out else torch.zeros(n, 0, device=tokens.device)

    # -- phases --------------------------------------------------------------------------------
    @phase("rollout")
    def rollout(self, iteration: int, shard: int, shards: int) -> Samples:
        p = self.dev["rollout"]
        device = p["emb"].device
        mine = shard_prompts(self.prompts, shard, shards)
        rows = [(q, k) for q in mine for k in range(self.group)]
        n = len(rows)
        prompts = {q: self.prompt(iteration, q) for q in mine}
        target = torch.tensor([prompts[q][0] for q, _ in rows], dtype=torch.long)
        context = torch.tensor([prompts[q][1] for q, _ in rows], dtype=torch.long).reshape(n, CONTEXT)
        cap = self.max_new_tokens if n else 0  # decoding stops earlier, once every response has ended
        # one generator per response: its draws do not depend on the share it is decoded in
        u_stop, u_tok = torch.empty(cap, n), torch.empty(cap, n, 1)  # step-major: each step's draws contiguous
        for i, (q, k) in enumerate(rows):
            g = torch.Generator().manual_seed(mix_seed(self.seed, iteration, q, k, STREAM_SAMPLE))
            u = torch.rand(cap, 2, generator=g)
            u_stop[:, i], u_tok[:, i, 0] = u[:, 0], u[:, 1]
        tokens = torch.zeros(n, cap, dtype=torch.long)
        logp = torch.zeros(n, cap)
        length = torch.zeros(n, dtype=torch.long)
        with torch.no_grad():
            us, ut, td, cd = u_stop.to(device), u_tok.to(device), target.to(device), context.to(device)
            h = self._h0(p, cd, td)
            prev = torch.full((n,), EOS, dtype=torch.long, device=device)
            alive = torch.ones(n, dtype=torch.bool, device=device)
            toks, lps, alive_at = [], [], []
            for t in range(cap):
                self.check_cancelled()
                feat = self._features(torch.full((n,), t, device=device), td)
                for _ in range(self.step_repeat):  # a costlier decoding step, same result
                    gi = self._gates_in(p, prev, feat)
                    h_new = self._cell(p, gi, h)
                    stop, tok_logp = self._heads(p, h_new, feat)
                h = h_new
                hazard = torch.sigmoid(stop)
                other = torch.searchsorted(torch.cumsum(tok_logp.exp(), -1), ut[t]).squeeze(-1)
                token = torch.where(us[t] < hazard, EOS, other.clamp(max=self.vocab - 2) + 1)
                toks.append(token)
                lps.append(self._logp(p, stop, tok_logp, token))
                alive_at.append(alive)
                alive = alive & (token != EOS)
                prev = token
                if not bool(alive.any()):
                    break
            self.check_cancelled()
            if toks:
                steps = len(toks)
                mask = torch.stack(alive_at, 1).cpu()
                tokens = (torch.stack(toks, 1).cpu() * mask)
                logp = torch.stack(lps, 1).cpu() * mask
                length = mask.sum(1)
            else:
                steps = 0
                mask = torch.zeros(n, 0, dtype=torch.bool)
                tokens, logp = tokens[:, :0], logp[:, :0]
        pid = torch.tensor([q for q, _ in rows], dtype=torch.long)
        ids = [f"{self.job}/{iteration}/p{q}/{k}" for q, k in rows]
        data = {"context": context, "target": target, "pid": pid, "tokens": tokens, "mask": mask.float(),
                "length": length, "logp": logp}
        lf = length.float()
        stats = {"mean_len": float(lf.mean()) if n else 0.0, "max_len": float(lf.max()) if n else 0.0,
                 "mean_target": float(target.float().mean()) if n else 0.0, "decode_steps": float(steps)}
        return Samples(self.job, iteration, shard, shards, data, count=n, tokens=int(length.sum()), ids=ids,
                       stats=stats)

    @phase("reward")
    def reward(self, samples: Samples) -> Samples:
        d = samples.data
        lf, tf = d["length"].float(), d["target"].float()
        r = 1 - ((lf - tf).abs() / tf).clamp(max=1.0)
        adv = torch.zeros_like(r)
        for q in d["pid"].unique().tolist():  # whole groups: a shard holds whole prompts
            rows = d["pid"] == q
            rq = r[rows]
            adv[rows] = (rq - rq.mean()) / (rq.std(unbiased=False) + ADV_EPS)
        d["reward"], d["advantage"] = r, adv
        samples.stats["mean_reward"] = float(r.mean()) if len(r) else 0.0
        samples.stats["mean_len_error"] = float(((lf - tf).abs() / tf).mean()) if len(r) else 0.0
        return samples

    @phase("train")
    def train(self, iteration: int, samples: Samples, all_reduce: AllReduce) -> dict[str, float]:
        s = self.dev["train"]
        device = s["emb"].device
        d = {k: samples.data[k].to(device) for k in ("context", "target", "tokens", "mask", "logp", "advantage")}
        if samples.count:  # trim the padding of the merged batch
            steps = int(d["mask"].sum(1).max())
            for k in ("tokens", "mask", "logp"):
                d[k] = d[k][:, :steps]
        loss_value = 0.0
        for _ in range(self.epochs):
            params = {k: s[k].detach().requires_grad_(True) for k in PARAMS}
            if samples.count:
                new = self.sequence_logp(params, d["context"], d["target"], d["tokens"])
                ratio = torch.exp(new - d["logp"])
                adv = d["advantage"][:, None]
                obj = torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
                loss = -(obj * d["mask"]).sum() / d["mask"].sum().clamp(min=1.0)
            else:  # an empty share still takes part in the all-reduce
                loss = sum(params[k].sum() for k in PARAMS) * 0.0
            grads = list(torch.autograd.grad(loss, [params[k] for k in PARAMS], allow_unused=True))
            grads = [torch.zeros_like(params[k]) if g is None else g for k, g in zip(PARAMS, grads)]
            all_reduce(grads)
            adam_step(s, PARAMS, grads, self.lr)
            loss_value = float(loss.detach())
        return {"loss": loss_value}
