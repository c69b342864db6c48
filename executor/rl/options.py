"""The ``workload`` block of a grpo job, validated once at the edge.

``GRPOOptions.from_mapping`` checks types and ranges (in every process); ``executor.rl.checks`` also
checks what lives outside the block (the model directory, the dataset, the reward's import), in the
controller before any worker starts (``weave_rl.executor.workload.check_workload``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from weave_rl.executor.rl.tasks import TASKS
from weave_rl.executor.workload import OptionError

MODELS = ("tiny", "smollm2")
ENGINES = ("torch", "vllm")


@dataclass(frozen=True)
class GRPOOptions:
    task: str = "addition"         # addition | sort | copy (synthetic prompts; not with dataset)
    digits: int = 3                # problem size (digits per operand / sequence)
    model: str = "tiny"            # tiny: random Llama from a config (seeded); smollm2: SmolLM2-135M GGUF;
                                   # else a local Hugging Face causal-LM directory (config, weights, tokenizer)
    chat_template: bool = True     # smollm2, model directory: wrap prompts in the tokenizer's chat template, if any
    # prompts from a file instead of a synthetic task
    dataset: str = ""              # a .jsonl or .parquet file of prompts with reference answers
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    shuffle: bool = True           # each epoch a permutation seeded by (seed, epoch); false: file order
    reward: str = ""               # partial | exact | numeric | package.module:function; "": partial for
                                   # synthetic tasks, exact for a dataset
    # tiny-model shape
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    # rollout
    prompts_per_iteration: int = 8
    group_size: int = 8            # responses per prompt (GRPO group)
    max_new_tokens: int = 0        # 0: answer length + 1 (room for EOS); with a dataset, 64
    temperature: float = 1.0
    engine: str = "torch"          # rollout engine: torch (KV-cache decoding here) | vllm (executor.rl.vllm_engine)
    # train
    lr: float = 3e-3
    clip: float = 0.2              # PPO ratio clip
    kl_coef: float = 0.0           # > 0 keeps a frozen reference policy in the train role's state
    epochs: int = 1                # optimizer steps per train phase on the same samples
    train_layers: int = 0          # > 0: train only the last N transformer blocks and what follows them
                                   # (final norm, an untied LM head); the rest stays frozen. 0: every parameter
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
                raise OptionError(key, f"unknown option (known: {', '.join(sorted(known))})",
                                  f"grpo workload: unknown option {key!r} (known: {', '.join(sorted(known))})")
        if options.get("dataset") and ({"task", "digits"} & set(options)):
            key = "task" if "task" in options else "digits"
            raise OptionError(key, "a synthetic task and a dataset exclude each other: drop one",
                              f"grpo workload: option {key!r} and option 'dataset' exclude each other")
        values: dict[str, Any] = {}
        for key, raw in options.items():
            kind = type(known[key].default)
            if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
                raw = float(raw)
            if not isinstance(raw, kind) or (isinstance(raw, bool) and kind is not bool):
                raise OptionError(key, f"must be {kind.__name__}, got {raw!r}",
                                  f"grpo workload: option {key!r} must be {kind.__name__}, got {raw!r}")
            values[key] = raw
        return cls(**values)

    @property
    def builtin_model(self) -> bool:
        return self.model in MODELS

    @property
    def reward_name(self) -> str:
        return self.reward or ("exact" if self.dataset else "partial")

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> OptionError:
            got = getattr(self, key)
            return OptionError(key, f"{why}, got {got!r}", f"grpo workload: option {key!r} {why}, got {got!r}")

        if self.task not in TASKS:
            raise bad("task", f"must be one of {', '.join(TASKS)}")
        if not self.model.strip():
            raise bad("model", f"must be one of {', '.join(MODELS)} or a model directory")
        if self.engine not in ENGINES:
            raise bad("engine", f"must be one of {', '.join(ENGINES)}")
        if not self.prompt_field or not self.answer_field:
            raise bad("prompt_field" if not self.prompt_field else "answer_field", "must not be empty")
        for key in ("digits", "hidden_size", "layers", "heads", "prompts_per_iteration", "group_size", "epochs"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        for key in ("max_new_tokens", "threads", "train_layers"):
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

