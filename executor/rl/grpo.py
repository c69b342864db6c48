"""The built-in GRPO job behind the phase shim (executor.workload.Workload).

State per role (host dicts of CPU tensors, keys below; ``N`` = a ``named_parameters`` name):
- rollout: ``policy.N``;
- train: ``policy.N``, ``optim.N.exp_avg``, ``optim.N.exp_avg_sq``, ``optim.N.step`` (AdamW; for the
  trained parameters only, see ``train_layers``) and, when ``kl_coef > 0``, the frozen reference ``ref.N``.
Each role keeps a parameter-less model skeleton; a warm switch swaps tensors into it (``p.data``),
so the optimizer, bound to the same Parameter objects, survives offloads.

With ``engine: vllm`` the rollout role runs on a vLLM engine (``weave_rl.executor.rl.vllm_engine``), built at
the first ``to_device`` and kept: ``to_host`` puts it to sleep and returns the host copy (which
weight syncs keep current), ``to_device`` wakes it with the host copy's weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import PreTrainedModel

from weave_rl.executor.rl.checks import check_options
from weave_rl.executor.rl.data import PromptStream, load_problems
from weave_rl.executor.rl.loss import clipped_loss, group_advantages
from weave_rl.executor.rl.model import build_model, build_tokenizer, initial_params, trainable_names
from weave_rl.executor.rl.options import GRPOOptions
from weave_rl.executor.rl.rewards import call_reward, load_reward
from weave_rl.executor.prompt_groups import mix_seed, shard_prompts
from weave_rl.executor.rl.samples import STREAM_PROMPT, STREAM_SAMPLE, response_id
from weave_rl.executor.rl.sampling import left_pad, response_logprobs, sample
from weave_rl.executor.rl.tasks import Problem, Task
from weave_rl.executor.workload import AllReduce, HostState, Role, Samples, Workload, phase, register_workload

ROLES: tuple[Role, ...] = ("rollout", "train")
_ADAM_KEYS = ("exp_avg", "exp_avg_sq")


@dataclass
class _Slot:
    """One role's model skeleton(s) and where its tensors live now."""

    policy: PreTrainedModel
    ref: PreTrainedModel | None = None
    optimizer: torch.optim.AdamW | None = None
    device: torch.device | None = None      # None: offloaded
    host: HostState | None = None           # the latest host copy this instance knows of
    names: list[str] = field(default_factory=list)
    trained: list[str] = field(default_factory=list)  # the names the optimizer updates (train role)


def _empty_params(model: PreTrainedModel) -> None:
    for p in model.parameters():
        p.data = torch.empty(0, dtype=p.dtype)
        p.grad = None


def _move_buffers(model: PreTrainedModel, device: torch.device) -> None:
    # Non-persistent constants (rotary inv_freq): small, not part of the moved state.
    for module in model.modules():
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = buf.to(device)


@register_workload("grpo")
class GRPOWorkload(Workload):
    """GRPO on a verifiable synthetic task or a prompt dataset (``weave_rl.executor.rl.options.GRPOOptions``)."""

    def __init__(self, job: str, options: Mapping[str, Any], seed: int) -> None:
        super().__init__(job, options, seed)
        self.opts = GRPOOptions.from_mapping(self.options)
        if self.opts.threads:
            torch.set_num_threads(self.opts.threads)
        self.task: Task | None = None
        self.stream: PromptStream | None = None
        if self.opts.dataset:
            problems = load_problems(self.opts.dataset, self.opts.prompt_field, self.opts.answer_field)
            self.stream = PromptStream(problems, self.opts.prompts_per_iteration, seed, self.opts.shuffle)
            self.max_new_tokens = self.opts.max_new_tokens or 64
        else:
            self.task = Task(self.opts.task, self.opts.digits)
            self.max_new_tokens = self.opts.max_new_tokens or self.task.answer_len + 1
        self.reward_fn = load_reward(self.opts.reward_name)
        self.tokenizer = build_tokenizer(self.opts)
        self.chat = self.opts.chat_template and bool(getattr(self.tokenizer, "has_chat_template", False))
        self._slots: dict[Role, _Slot] = {}
        self._layout_cache: dict[Role, dict[str, tuple[torch.Size, torch.dtype]]] = {}
        self._pending: dict[str, torch.Tensor] | None = None  # synced weights before any rollout state
        self.rollout_engine: Any = None  # engine: vllm -> the VLLMRollout, once the rollout role first loads

    @classmethod
    def check_options(cls, options: Mapping[str, Any], base: Path) -> dict[str, Any]:
        """In the controller, before any worker starts: see ``weave_rl.executor.rl.checks.check_options``."""
        return check_options(options, base)

    # -- problems ----------------------------------------------------------------------------------
    def problem(self, iteration: int, prompt: int) -> Problem:
        """Prompt ``prompt`` of ``iteration``: depends only on (seed, iteration, prompt index)."""
        if self.stream is not None:
            return self.stream.problem(iteration, prompt)
        assert self.task is not None
        return self.task.problem(mix_seed(self.seed, iteration, prompt, STREAM_PROMPT))

    def _longest_prompt(self) -> int:
        """Tokens of the longest prompt the job can draw (a synthetic task's prompts are fixed width)."""
        if self.stream is None:
            return len(self._prompt_tokens(self.problem(0, 0)))
        return max(len(self._prompt_tokens(pr)) for pr in self.stream.problems)

    def _prompt_tokens(self, problem: Problem) -> list[int]:
        if self.chat:  # the template brings its own BOS and turn markers
            return self.tokenizer.chat_prompt(problem.prompt)  # type: ignore[attr-defined]
        bos = [self.tokenizer.bos_id] if self.tokenizer.bos_id is not None else []
        return bos + self.tokenizer.encode(problem.prompt)

    # -- state layout --------------------------------------------------------------------------------
    def _check_role(self, role: str) -> Role:
        if role not in ROLES:
            raise ValueError(f"grpo workload: unknown role {role!r} (known: {', '.join(ROLES)})")
        return role  # type: ignore[return-value]

    def _fresh_state(self, role: Role) -> HostState:
        params = initial_params(self.opts, self.tokenizer, self.seed)
        state = {f"policy.{n}": t for n, t in params.items()}
        if role == "train":
            for n in trainable_names(list(params), self.opts.train_layers):
                for key in _ADAM_KEYS:
                    state[f"optim.{n}.{key}"] = torch.zeros_like(params[n])
                state[f"optim.{n}.step"] = torch.zeros((), dtype=torch.float32)
            if self.opts.kl_coef > 0:
                state.update({f"ref.{n}": t.clone() for n, t in params.items()})
        return state

    def _layout(self, role: Role) -> dict[str, tuple[torch.Size, torch.dtype]]:
        if role not in self._layout_cache:
            self._layout_cache[role] = {k: (t.shape, t.dtype) for k, t in self._fresh_state(role).items()}
        return self._layout_cache[role]

    def _slot(self, role: Role) -> _Slot:
        if role not in self._slots:
            policy = build_model(self.opts, self.tokenizer, self.seed)
            slot = _Slot(policy=policy, names=[n for n, _ in policy.named_parameters()])
            if role == "train":
                slot.trained = trainable_names(slot.names, self.opts.train_layers)
                params = dict(policy.named_parameters())
                frozen = set(slot.names) - set(slot.trained)
                for n in frozen:  # no gradient, so no backward through the blocks below the trained ones
                    params[n].requires_grad_(False)
                slot.optimizer = torch.optim.AdamW([params[n] for n in slot.trained], lr=self.opts.lr,
                                                   weight_decay=self.opts.weight_decay)
                if self.opts.kl_coef > 0:
                    slot.ref = build_model(self.opts, self.tokenizer, self.seed).requires_grad_(False)
                    _empty_params(slot.ref)
            _empty_params(policy)
            self._slots[role] = slot
        return self._slots[role]

    def _device_tensors(self, slot: _Slot) -> dict[str, torch.Tensor]:
        """The role's live tensors by host key (what to_host copies back)."""
        out: dict[str, torch.Tensor] = {}
        params = dict(slot.policy.named_parameters())
        for n in slot.names:
            out[f"policy.{n}"] = params[n].data
        if slot.optimizer is not None:
            for n in slot.trained:
                st = slot.optimizer.state[params[n]]
                for key in _ADAM_KEYS:
                    out[f"optim.{n}.{key}"] = st[key]
                out[f"optim.{n}.step"] = st["step"]
        if slot.ref is not None:
            ref = dict(slot.ref.named_parameters())
            out.update({f"ref.{n}": ref[n].data for n in slot.names})
        return out

    def _on_device(self, role: Role) -> _Slot:
        slot = self._slots.get(role)
        if slot is None or slot.device is None:
            raise RuntimeError(f"grpo workload {self.job}: the {role} state is not on a device (call to_device first)")
        return slot

    # -- state movement ------------------------------------------------------------------------------
    def initial_state(self, role: Role) -> HostState:
        role = self._check_role(role)
        state = self._fresh_state(role)
        if torch.cuda.is_available():  # pinned host memory makes the warm switch an async DMA
            state = {k: t.pin_memory() for k, t in state.items()}
        slot = self._slot(role)
        if slot.device is None:  # the copy the worker will hand to to_device: synced weights land here
            slot.host = state
        return state

    def to_device(self, role: Role, state: HostState, device: torch.device) -> None:
        role = self._check_role(role)
        device = torch.device(device)
        slot = self._slot(role)
        if slot.device is not None:
            raise RuntimeError(f"grpo workload {self.job}: the {role} state is already on {slot.device}")
        layout = self._layout(role)
        missing, extra = sorted(set(layout) - set(state)), sorted(set(state) - set(layout))
        if missing or extra:
            raise ValueError(f"grpo workload {self.job}: {role} state does not match "
                             f"(missing: {missing[:5]}, unexpected: {extra[:5]})")
        for key, (shape, dtype) in layout.items():
            if state[key].shape != shape or state[key].dtype != dtype:
                raise ValueError(f"grpo workload {self.job}: {role} state {key!r} is {tuple(state[key].shape)} "
                                 f"{state[key].dtype}, expected {tuple(shape)} {dtype}")

        if role == "rollout" and self.opts.engine == "vllm":
            self._engine_to_device(slot, state, device)
            return

        def load(t: torch.Tensor) -> torch.Tensor:
            # On CPU the device copy is a clone: the host dict stays the untouched host copy.
            return t.clone() if device.type == "cpu" else t.to(device, non_blocking=t.is_pinned())

        params = dict(slot.policy.named_parameters())
        for n in slot.names:
            params[n].data = load(state[f"policy.{n}"])
        _move_buffers(slot.policy, device)
        if slot.ref is not None:
            ref = dict(slot.ref.named_parameters())
            for n in slot.names:
                ref[n].data = load(state[f"ref.{n}"])
            _move_buffers(slot.ref, device)
        if slot.optimizer is not None:
            slot.optimizer.state.clear()
            for n in slot.trained:
                entry = {key: load(state[f"optim.{n}.{key}"]) for key in _ADAM_KEYS}
                entry["step"] = state[f"optim.{n}.step"].clone()  # AdamW keeps step on the CPU
                slot.optimizer.state[params[n]] = entry
        slot.device, slot.host = device, state
        if role == "rollout" and self._pending is not None:
            self._install(slot, self._pending)
            self._pending = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _engine_to_device(self, slot: _Slot, state: HostState, device: torch.device) -> None:
        from weave_rl.executor.rl.vllm_engine import EngineShape, VLLMRollout

        slot.host = state  # the one copy of the rollout weights: syncs land in it (_install)
        if self._pending is not None:
            self._install(slot, self._pending)
            self._pending = None
        weights = {n: state[f"policy.{n}"] for n in slot.names}
        if self.rollout_engine is None:
            shape = EngineShape(self.opts.prompts_per_iteration * self.opts.group_size,
                                self._longest_prompt() + self.max_new_tokens)
            engine = VLLMRollout(build_model(self.opts, self.tokenizer, self.seed), shape, seed=self.seed,
                                 tokenizer=getattr(self.tokenizer, "tok", None))  # the HF tokenizer, if any
            engine.start(weights, device)
            self.rollout_engine = engine
        else:
            self.rollout_engine.wake_up(weights)
        slot.device = device

    def to_host(self, role: Role) -> HostState:
        role = self._check_role(role)
        slot = self._on_device(role)
        assert slot.device is not None
        if role == "rollout" and self.rollout_engine is not None:
            self.rollout_engine.sleep()
            assert slot.host is not None
            slot.device = None
            return slot.host
        live = self._device_tensors(slot)
        if slot.device.type == "cpu":
            host = dict(live)  # the live tensors already are host memory, and ours alone
        else:  # copy back into the pinned buffers we loaded from (the worker's host copy), if any
            old = slot.host or {}
            host = {}
            for key, t in live.items():
                buf = old.get(key)
                if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or not buf.is_pinned():
                    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host[key] = buf.copy_(t, non_blocking=True)
            torch.cuda.synchronize(slot.device)
        _empty_params(slot.policy)
        _move_buffers(slot.policy, torch.device("cpu"))
        if slot.ref is not None:
            _empty_params(slot.ref)
            _move_buffers(slot.ref, torch.device("cpu"))
        if slot.optimizer is not None:
            slot.optimizer.state.clear()
        if slot.device.type == "cuda":
            torch.cuda.empty_cache()
        slot.device, slot.host = None, host
        return host

    def state_bytes(self, role: Role) -> int:
        role = self._check_role(role)
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in self._layout(role).values())

    # -- weight sync ---------------------------------------------------------------------------------
    def policy_weights(self) -> dict[str, torch.Tensor]:
        slot = self._slots.get("train")
        if slot is not None and slot.device is not None:
            return {n: p.detach().to("cpu", copy=True) for n, p in slot.policy.named_parameters()}
        if slot is not None and slot.host is not None:
            return {n: slot.host[f"policy.{n}"].clone() for n in slot.names}
        raise RuntimeError(f"grpo workload {self.job}: no train state to take policy weights from")

    def load_policy_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        slot = self._slot("rollout")
        missing, extra = sorted(set(slot.names) - set(weights)), sorted(set(weights) - set(slot.names))
        if missing or extra:
            raise ValueError(f"grpo workload {self.job}: synced weights do not match the policy "
                             f"(missing: {missing[:5]}, unexpected: {extra[:5]})")
        if slot.device is not None or slot.host is not None:
            self._install(slot, weights)
        else:  # no rollout state yet: applied by the next to_device
            self._pending = {n: w.detach().to("cpu", copy=True) for n, w in weights.items()}

    def _install(self, slot: _Slot, weights: Mapping[str, torch.Tensor]) -> None:
        if self.opts.engine == "vllm" and slot is self._slots.get("rollout"):
            assert slot.host is not None
            with torch.no_grad():  # the host copy, then the engine when awake
                for n in slot.names:
                    slot.host[f"policy.{n}"].copy_(weights[n])
            if slot.device is not None:
                self.rollout_engine.load_weights(weights)
            return
        with torch.no_grad():
            if slot.device is not None:
                params = dict(slot.policy.named_parameters())
                for n in slot.names:
                    params[n].copy_(weights[n])
            else:  # offloaded: update the host copy in place, which the worker passes to to_device
                assert slot.host is not None
                for n in slot.names:
                    slot.host[f"policy.{n}"].copy_(weights[n])

    def model(self, role: Role) -> PreTrainedModel:
        """The role's policy as it is now on its device (for inspection and tests)."""
        return self._on_device(self._check_role(role)).policy

    # -- phases --------------------------------------------------------------------------------------
    @phase("rollout")
    def rollout(self, iteration: int, shard: int, shards: int) -> Samples:
        slot = self._on_device("rollout")
        assert slot.device is not None
        group, steps = self.opts.group_size, self.max_new_tokens
        prompts = shard_prompts(self.opts.prompts_per_iteration, shard, shards)
        rows: list[list[int]] = []
        noise: list[torch.Tensor] = []
        for p in prompts:
            rows += [self._prompt_tokens(self.problem(iteration, p))] * group
            gen = torch.Generator().manual_seed(mix_seed(self.seed, iteration, p, STREAM_SAMPLE))
            noise.append(torch.rand((group, steps), generator=gen))
        n = len(rows)
        prompt_index = torch.tensor([p for p in prompts for _ in range(group)], dtype=torch.long)
        stop = self.check_cancelled if self._cancel_check is not None else None  # an elastic prompt group
        if n and self.rollout_engine is not None:
            prompt_ids, prompt_mask = left_pad(rows, self.tokenizer.pad_id)
            out = self.rollout_engine.sample(
                rows[::group], [mix_seed(self.seed, iteration, p, STREAM_SAMPLE) for p in prompts], group=group,
                max_tokens=steps, temperature=self.opts.temperature, eos_id=self.tokenizer.eos_id,
                pad_id=self.tokenizer.pad_id, between_steps=stop)
            response_ids, response_mask, logprobs = out.response_ids, out.response_mask, out.logprobs
        elif n:
            prompt_ids, prompt_mask = left_pad(rows, self.tokenizer.pad_id)
            dev = slot.device
            out = sample(slot.policy, prompt_ids.to(dev), prompt_mask.to(dev), torch.cat(noise).to(dev),
                         temperature=self.opts.temperature, eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id,
                         between_steps=stop)
            response_ids, response_mask, logprobs = out.response_ids.cpu(), out.response_mask.cpu(), out.logprobs.cpu()
        else:  # more shards than prompts: an empty share, same columns
            prompt_ids, prompt_mask = torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1), dtype=torch.bool)
            response_ids = torch.zeros((0, steps), dtype=torch.long)
            response_mask = torch.zeros((0, steps), dtype=torch.bool)
            logprobs = torch.zeros((0, steps))
        tokens = int(response_mask.sum())
        ids = [response_id(self.job, iteration, shard, p * group + g) for p in prompts for g in range(group)]
        stats = {"response_len_mean": tokens / n} if n else {}
        return Samples(job=self.job, iteration=iteration, shard=shard, shards=shards, count=n, tokens=tokens, ids=ids,
                       stats=stats, data={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
                                          "response_ids": response_ids, "response_mask": response_mask,
                                          "old_logprobs": logprobs, "prompt_index": prompt_index})

    def response_text(self, ids: torch.Tensor, mask: torch.Tensor) -> str:
        """A response as text: its tokens before EOS (the whole budget when it never stopped)."""
        toks = ids[mask].tolist()
        if toks and toks[-1] == self.tokenizer.eos_id:
            toks = toks[:-1]
        return self.tokenizer.decode(toks)

    @phase("reward")
    def reward(self, samples: Samples) -> Samples:
        """Score each response against its prompt's answer; add ``rewards`` and ``advantages``.

        Updates ``samples`` in place and returns it.
        """
        data = samples.data
        index = data["prompt_index"]
        problems = {p: self.problem(samples.iteration, p) for p in set(index.tolist())}
        texts = [self.response_text(data["response_ids"][i], data["response_mask"][i]) for i in range(len(index))]
        name = self.opts.reward_name
        values = []
        for i, (p, text) in enumerate(zip(index.tolist(), texts)):
            pr = problems[int(p)]
            where = f"response {samples.ids[i] if i < len(samples.ids) else i} of job {self.job}"
            values.append(call_reward(self.reward_fn, name, pr.prompt, text, pr.answer, where))
        rewards = torch.tensor(values, dtype=torch.float32)
        sizes = torch.bincount(index) if len(index) else torch.zeros(0, dtype=torch.long)
        if bool((sizes[sizes > 0] != self.opts.group_size).any()):
            raise ValueError(f"grpo workload {self.job}: a prompt's group is split across shards "
                             f"(group sizes {sorted(set(sizes[sizes > 0].tolist()))}, expected {self.opts.group_size})")
        data["rewards"] = rewards
        data["advantages"] = group_advantages(rewards, index, self.opts.adv_eps)
        if len(rewards):
            samples.stats["reward_mean"] = float(rewards.mean())
            samples.stats["solved"] = float((rewards == 1.0).float().mean())
        return samples

    @phase("train")
    def train(self, iteration: int, samples: Samples, all_reduce: AllReduce) -> dict[str, float]:
        """One optimizer step (``epochs`` of them) on this worker's samples, gradients all-reduced.

        Each worker backpropagates the *sum* of its per-response losses and appends its response
        count (and metric sums) to the all-reduced list; dividing the averaged gradient by the
        averaged count gives the global mean gradient for any split of responses over workers.
        """
        slot = self._on_device("train")
        assert slot.device is not None and slot.optimizer is not None
        if "advantages" not in samples.data:
            raise ValueError(f"grpo workload {self.job}: train got samples without advantages (run reward first)")
        dev = slot.device
        d = {k: v.to(dev) for k, v in samples.data.items()}
        named = dict(slot.policy.named_parameters())
        params = [named[name] for name in slot.trained]
        n = samples.count
        ref_logp = None
        if n and slot.ref is not None and self.opts.kl_coef > 0:
            with torch.no_grad():
                ref_logp = response_logprobs(slot.ref, d["prompt_ids"], d["prompt_mask"], d["response_ids"],
                                             d["response_mask"], temperature=self.opts.temperature)
        metrics: dict[str, float] = {}
        skipped = 0  # optimizer steps left out for a non-finite gradient
        for _ in range(self.opts.epochs):
            for p in params:
                p.grad = None
            sums = torch.zeros(6, device=dev)  # count, loss, kl, reward, clipped tokens, tokens
            if n:
                logp = response_logprobs(slot.policy, d["prompt_ids"], d["prompt_mask"], d["response_ids"],
                                         d["response_mask"], temperature=self.opts.temperature)
                out = clipped_loss(logp, d["old_logprobs"], d["advantages"], d["response_mask"], clip=self.opts.clip,
                                   ref_logp=ref_logp, kl_coef=self.opts.kl_coef)
                out.loss.backward()
                sums = torch.stack([torch.tensor(float(n), device=dev), out.loss.detach(), out.kl, d["rewards"].sum(),
                                    out.clipped, out.tokens]).float()
            grads = []
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
            all_reduce(grads + [sums])  # averages in place over the phase's workers
            mean_count = float(sums[0])
            grad_norm = 0.0
            if mean_count > 0:
                for g in grads:
                    g.div_(mean_count)
                clip_to = self.opts.max_grad_norm or float("inf")
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip_to))
                if math.isfinite(grad_norm):
                    slot.optimizer.step()
                else:  # one bad batch must not turn every weight into NaN for good (veRL skips it too)
                    skipped += 1
            for p in params:
                p.grad = None
            total = max(mean_count, 1e-12)
            metrics = {"loss": float(sums[1]) / total, "kl": float(sums[2]) / total,
                       "reward_mean": float(sums[3]) / total,
                       "clip_frac": float(sums[4]) / max(float(sums[5]), 1e-12), "grad_norm": grad_norm}
        metrics.update({"samples": float(n), "ids": float(len(samples.ids)), "tokens": float(samples.tokens),
                        "epochs": float(self.opts.epochs), "skipped_steps": float(skipped)})
        return metrics
