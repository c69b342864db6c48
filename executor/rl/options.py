"""The ``workload`` block of a grpo job, validated once at the edge."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from weave_rl.executor.rl.tasks import TASKS

MODELS = ("tiny", "smollm2")
ENGINES = ("torch", "vllm")


@dataclass(frozen=True)
class GRPOOptions:
    task: str = "addition"         # addition | sort | copy
    digits: int = 3                # problem size (digits per operand / sequence)
    model: str = "tiny"            # tiny: random Llama from a config (seeded); smollm2: SmolLM2-135M GGUF
    # tiny-model shape
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    # rollout
    prompts_per_iteration: int = 8
    group_size: int = 8            # responses per prompt (GRPO group)
    max_new_tokens: int = 0        # 0: answer length + 1 (room for EOS)
    temperature: float = 1.0
    engine: str = "torch"          # rollout engine: torch (KV-cache decoding here) | vllm (executor.rl.vllm_engine)
    # train
    lr: float = 3e-3
    clip: float = 0.2              # PPO ratio clip
    kl_coef: float = 0.0           # > 0 keeps a frozen reference policy in the train role's state
    epochs: int = 1                # optimizer steps per train phase on the same samples
    max_grad_norm: float = 1.0     # 0: no clipping
    weight_decay: float = 0.0
    adv_eps: float = 1e-4          # (r - mean) / (std + eps)
    # process
    threads: int = 0               # > 0: torch.set_num_threads(threads); 0 leaves the worker's setting

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> "GRPOOptions":
        known = {f.name: f for f in fields(cls)}
        for key in options:
            if key not in known:
                raise ValueError(f"grpo workload: unknown option {key!r} (known: {', '.join(sorted(known))})")
        values: dict[str, Any] = {}
        for key, raw in options.items():
            kind = type(known[key].default)
            if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
                raw = float(raw)
            if not isinstance(raw, kind) or isinstance(raw, bool):
                raise ValueError(f"grpo workload: option {key!r} must be {kind.__name__}, got {raw!r}")
            values[key] = raw
        return cls(**values)

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"grpo workload: option {key!r} {why}, got {getattr(self, key)!r}")

        if self.task not in TASKS:
            raise bad("task", f"must be one of {', '.join(TASKS)}")
        if self.model not in MODELS:
            raise bad("model", f"must be one of {', '.join(MODELS)}")
        if self.engine not in ENGINES:
            raise bad("engine", f"must be one of {', '.join(ENGINES)}")
        for key in ("digits", "hidden_size", "layers", "heads", "prompts_per_iteration", "group_size", "epochs"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        for key in ("max_new_tokens", "threads"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0")
        if self.hidden_size % self.heads:
            raise bad("hidden_size", f"must be a multiple of heads ({self.heads})")
        if not self.temperature > 0:
            raise bad("temperature", "must be > 0")
        if not self.lr > 0:
            raise bad("lr", "must be > 0")
        if not 0 < self.clip < 1:
            raise bad("clip", "must be in (0, 1)")
        for key in ("kl_coef", "max_grad_norm", "weight_decay"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0")
        if not self.adv_eps > 0:
            raise bad("adv_eps", "must be > 0")
