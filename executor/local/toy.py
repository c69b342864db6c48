"""``bandit``: a tiny but real policy-gradient job for tests and benchmarks of the local backend.

A contextual bandit: a context ``x`` (``features`` floats) has one correct arm out of ``arms``
(argmax of a fixed random linear map of ``x``). The policy is a two-layer MLP; a rollout samples
one arm per prompt (reward 1 when right), repeating the forward pass ``steps`` times as a stand-in
for autoregressive decoding (``tokens`` = prompts x steps); train is REINFORCE with a batch-mean
baseline and Adam, ``epochs`` passes over the shard, gradients averaged with the ``all_reduce``
callback. Jobs file::

    workload: {kind: bandit, batch: 64, hidden: 64, steps: 4, epochs: 1, lr: 0.05}

State movement (``tensor_state.TensorStateWorkload``) copies tensors, also on CPU, where ``.to("cpu")``
would alias, so the warm switch moves real bytes; host copies are pinned when the device is CUDA.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import torch

from weave_rl.executor.local.tensor_state import TensorStateWorkload, adam_step
from weave_rl.executor.workload import AllReduce, OptionError, Samples, phase, register_workload

PARAMS = ("w1", "b1", "w2", "b2")
OPTIONS = {"arms": int, "features": int, "hidden": int, "batch": int, "steps": int, "epochs": int, "lr": float}


@register_workload("bandit")
class Bandit(TensorStateWorkload):
    PARAMS = PARAMS
    kind = "bandit"

    def __init__(self, job: str, options: Mapping[str, Any], seed: int) -> None:
        super().__init__(job, options, seed)
        o = self.options
        self.check_options(o, Path("."))
        self.arms = int(o.get("arms", 8))
        self.features = int(o.get("features", 16))
        self.hidden = int(o.get("hidden", 64))
        self.batch = int(o.get("batch", 64))
        self.steps = int(o.get("steps", 4))
        self.epochs = int(o.get("epochs", 1))
        self.lr = float(o.get("lr", 0.05))
        g = torch.Generator().manual_seed(10_007 * seed + 1)
        self.truth = torch.randn(self.features, self.arms, generator=g)

    @classmethod
    def check_options(cls, options: Mapping[str, Any], base: Path) -> None:
        """Every option a positive number of its type (``lr`` a float, the others integers), no unknown key."""
        for key, value in options.items():
            if key not in OPTIONS:
                raise OptionError(key, f"unknown bandit option (options: {', '.join(OPTIONS)})")
            kind = OPTIONS[key]
            ok = (not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
                  and math.isfinite(value) and value > 0)
            if not ok:
                raise OptionError(key, f"expected a positive {'number' if kind is float else 'integer'}, got {value!r}")
        return None

    # -- state ---------------------------------------------------------------------------------
    def fresh_params(self) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        p = {"w1": torch.randn(self.features, self.hidden, generator=g) / self.features ** 0.5,
             "b1": torch.zeros(self.hidden),
             "w2": torch.randn(self.hidden, self.arms, generator=g) / self.hidden ** 0.5,
             "b2": torch.zeros(self.arms)}
        return p

    # -- phases --------------------------------------------------------------------------------
    def _logits(self, p: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]

    @phase("rollout")
    def rollout(self, iteration: int, shard: int, shards: int) -> Samples:
        p = self.dev["rollout"]
        device = p["w1"].device
        n = self.batch // shards + (1 if shard < self.batch % shards else 0)
        g = torch.Generator().manual_seed(hash((self.seed, iteration, shard, shards)) & 0x7FFFFFFF)
        x = torch.randn(n, self.features, generator=g)
        u = torch.rand(n, generator=g)
        with torch.no_grad():
            xd = x.to(device)
            for _ in range(self.steps):  # stands in for decoding steps
                logits = self._logits(p, xd)
            probs = torch.softmax(logits, -1).cpu()
        arm = torch.searchsorted(torch.cumsum(probs, -1), u[:, None]).clamp(max=self.arms - 1).squeeze(1)
        logp = torch.log(probs.gather(1, arm[:, None]).squeeze(1) + 1e-12)
        ids = [f"{self.job}/{iteration}/{shard}/{i}" for i in range(n)]
        return Samples(self.job, iteration, shard, shards, {"x": x, "arm": arm, "logp": logp}, count=n,
                       tokens=n * self.steps, ids=ids)

    @phase("reward")
    def reward(self, samples: Samples) -> Samples:
        best = (samples.data["x"] @ self.truth).argmax(-1)
        r = (samples.data["arm"] == best).float()
        samples.data["reward"] = r
        samples.stats["mean_reward"] = float(r.mean()) if len(r) else 0.0
        return samples

    @phase("train")
    def train(self, iteration: int, samples: Samples, all_reduce: AllReduce) -> dict[str, float]:
        s = self.dev["train"]
        device = s["w1"].device
        x, arm, r = (samples.data[k].to(device) for k in ("x", "arm", "reward"))
        loss_value = 0.0
        for _ in range(self.epochs):
            params = {k: s[k].detach().requires_grad_(True) for k in PARAMS}
            adv = r - r.mean() if len(r) else r
            logp = torch.log_softmax(self._logits(params, x), -1).gather(1, arm[:, None]).squeeze(1)
            loss = -(adv * logp).mean() if len(r) else logp.sum() * 0.0
            grads = list(torch.autograd.grad(loss, [params[k] for k in PARAMS]))
            all_reduce(grads)
            adam_step(s, PARAMS, grads, self.lr)
            loss_value = float(loss.detach())
        return {"loss": loss_value}
