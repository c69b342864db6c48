"""A Workload whose state is a flat dict of tensors: the state movement, weight sync and Adam step
that the built-in toy jobs (``bandit``, ``longtail``) share.

A subclass names its policy tensors (``PARAMS``) and builds them (``fresh_params``); the train state
adds Adam's moments (``m.<name>``, ``v.<name>``) and ``step``. Every move copies real bytes (also on
CPU, where ``.to("cpu")`` would alias), so a warm switch costs what it would on a GPU; host copies
are pinned when the device is CUDA.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from weave_rl.executor.workload import HostState, Role, Workload


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


def adam_step(state: dict[str, torch.Tensor], names: Sequence[str], grads: Sequence[torch.Tensor], lr: float) -> None:
    """One Adam step (betas 0.9 / 0.999, eps 1e-8) on ``state``'s tensors ``names``, in place."""
    state["step"] += 1
    t = float(state["step"])
    with torch.no_grad():
        for k, gk in zip(names, grads):
            state[f"m.{k}"].mul_(0.9).add_(gk, alpha=0.1)
            state[f"v.{k}"].mul_(0.999).addcmul_(gk, gk, value=0.001)
            m_hat = state[f"m.{k}"] / (1 - 0.9 ** t)
            v_hat = state[f"v.{k}"] / (1 - 0.999 ** t)
            state[k].sub_(lr * m_hat / (v_hat.sqrt() + 1e-8))


class TensorStateWorkload(Workload):
    """The state half of the Workload contract for a flat dict of policy tensors (module doc)."""

    PARAMS: tuple[str, ...] = ()
    kind = "workload"  # named in errors

    def __init__(self, job: str, options: Mapping[str, Any], seed: int) -> None:
        super().__init__(job, options, seed)
        self.host: dict[str, HostState] = {}  # role -> its host copy
        self.dev: dict[str, dict[str, torch.Tensor]] = {}  # role -> its tensors on the device (while warm)
        self.pending: dict[str, torch.Tensor] | None = None  # synced before any rollout state existed

    def fresh_params(self) -> dict[str, torch.Tensor]:
        """The initial policy tensors (same seed, same values in every process)."""
        raise NotImplementedError

    def initial_state(self, role: Role) -> HostState:
        p = self.fresh_params()
        if role == "train":
            p.update({f"m.{k}": torch.zeros_like(p[k]) for k in self.PARAMS})
            p.update({f"v.{k}": torch.zeros_like(p[k]) for k in self.PARAMS})
            p["step"] = torch.zeros(())
        return p

    def to_device(self, role: Role, state: HostState, device: torch.device) -> None:
        if device.type == "cuda":
            for k, v in list(state.items()):
                if not v.is_pinned():
                    state[k] = v.pin_memory()
        if role in self.dev:
            raise RuntimeError(f"{self.kind} {self.job}: the {role} state is already on a device")
        self.host[role] = state
        self.dev[role] = move(state, device)
        if role == "rollout" and self.pending is not None:
            self.load_policy_weights(self.pending)
            self.pending = None

    def to_host(self, role: Role) -> HostState:
        return offload(self.dev.pop(role), self.host[role])

    def state_bytes(self, role: Role) -> int:
        state = self.dev.get(role) or self.host.get(role) or self.initial_state(role)
        return sum(t.numel() * t.element_size() for t in state.values())

    def policy_weights(self) -> dict[str, torch.Tensor]:
        src = self.dev.get("train") or self.host["train"]
        return {k: src[k].detach().to("cpu", copy=True) for k in self.PARAMS}

    def load_policy_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        target = self.dev.get("rollout") or self.host.get("rollout")
        if target is None:  # no rollout state yet: applied by the next to_device
            self.pending = {k: weights[k].detach().clone() for k in self.PARAMS}
            return
        for k in self.PARAMS:
            target[k].copy_(weights[k])
