"""``bandit``: a tiny but real policy-gradient job for tests and benchmarks of the local backend.

A contextual bandit: a context ``x`` (``features`` floats) has one correct arm out of ``arms``
(argmax of a fixed random linear map of ``x``). The policy is a two-layer MLP; a rollout samples
one arm per prompt (reward 1 when right), repeating the forward pass ``steps`` times as a stand-in
for autoregressive decoding (``tokens`` = prompts x steps); train is REINFORCE with a batch-mean
baseline and Adam, ``epochs`` passes over the shard, gradients averaged with the ``all_reduce``
callback. Jobs file::

    workload: {kind: bandit, batch: 64, hidden: 64, steps: 4, epochs: 1, lr: 0.05}

State movement copies tensors (also on CPU, where ``.to("cpu")`` would alias), so the warm switch
moves real bytes; host copies are pinned when the device is CUDA.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import torch

from weave_rl.executor.workload import (AllReduce, HostState, OptionError, Role, Samples, Workload, phase,
                                        register_workload)

PARAMS = ("w1", "b1", "w2", "b2")
OPTIONS = {"arms": int, "features": int, "hidden": int, "batch": int, "steps": int, "epochs": int, "lr": float}


def move(state: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Copy every tensor onto ``device`` (a real copy, also CPU to CPU)."""
    out = {}
    for k, v in state.items():
        t = torch.empty(v.shape, dtype=v.dtype, device=device)
        t.copy_(v, non_blocking=True)
        out[k] = t
    return out


def offload(dev: Mapping[str, torch.Tensor], host: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copy device tensors back into the host copy (in place, keeping pinned buffers)."""
    for k, v in dev.items():
        if k in host and host[k].shape == v.shape and host[k].dtype == v.dtype:
            host[k].copy_(v, non_blocking=True)
        else:
            host[k] = v.detach().to("cpu", copy=True)
    if any(v.is_cuda for v in dev.values()):
        torch.cuda.synchronize()
    return host


@register_workload("bandit")
class Bandit(Workload):
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
        self.host: dict[str, HostState] = {}
        self.dev: dict[str, dict[str, torch.Tensor]] = {}
        self.pending: dict[str, torch.Tensor] | None = None  # synced before any rollout state existed

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
    def initial_state(self, role: Role) -> HostState:
        g = torch.Generator().manual_seed(self.seed)
        p = {"w1": torch.randn(self.features, self.hidden, generator=g) / self.features ** 0.5,
             "b1": torch.zeros(self.hidden),
             "w2": torch.randn(self.hidden, self.arms, generator=g) / self.hidden ** 0.5,
             "b2": torch.zeros(self.arms)}
        if role == "train":
            p.update({f"m.{k}": torch.zeros_like(p[k]) for k in PARAMS})
            p.update({f"v.{k}": torch.zeros_like(p[k]) for k in PARAMS})
            p["step"] = torch.zeros(())
        return p

    def to_device(self, role: Role, state: HostState, device: torch.device) -> None:
        if device.type == "cuda":
            for k, v in list(state.items()):
                if not v.is_pinned():
                    state[k] = v.pin_memory()
        if role in self.dev:
            raise RuntimeError(f"bandit {self.job}: the {role} state is already on a device")
        self.host[role] = state
        self.dev[role] = move(state, device)
        if role == "rollout" and self.pending is not None:
            self.load_policy_weights(self.pending)
            self.pending = None

    def to_host(self, role: Role) -> HostState:
        dev = self.dev.pop(role)
        return offload(dev, self.host[role])

    def state_bytes(self, role: Role) -> int:
        state = self.dev.get(role) or self.host.get(role) or self.initial_state(role)
        return sum(t.numel() * t.element_size() for t in state.values())

    # -- weight sync ---------------------------------------------------------------------------
    def policy_weights(self) -> dict[str, torch.Tensor]:
        src = self.dev.get("train") or self.host["train"]
        return {k: src[k].detach().to("cpu", copy=True) for k in PARAMS}

    def load_policy_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        target = self.dev.get("rollout") or self.host.get("rollout")
        if target is None:  # no rollout state yet: applied by the next to_device
            self.pending = {k: weights[k].detach().clone() for k in PARAMS}
            return
        for k in PARAMS:
            target[k].copy_(weights[k])

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
            s["step"] += 1
            t = float(s["step"])
            with torch.no_grad():
                for k, gk in zip(PARAMS, grads):
                    s[f"m.{k}"].mul_(0.9).add_(gk, alpha=0.1)
                    s[f"v.{k}"].mul_(0.999).addcmul_(gk, gk, value=0.001)
                    m_hat = s[f"m.{k}"] / (1 - 0.9 ** t)
                    v_hat = s[f"v.{k}"] / (1 - 0.999 ** t)
                    s[k].sub_(self.lr * m_hat / (v_hat.sqrt() + 1e-8))
            loss_value = float(loss.detach())
        return {"loss": loss_value}
