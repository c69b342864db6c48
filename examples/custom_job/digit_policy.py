"""A job of your own under Weave: "name the largest digit", learnt by a policy-gradient loop.

Each prompt of ``prompts.jsonl`` is a string of digits with its answer, the largest digit. The
policy is a small MLP over the prompt's digit counts that picks one of ten answers; a rollout
samples ``group`` answers per prompt, the reward is 1 for the right one, and train is REINFORCE
with a group-mean baseline (GRPO's advantage, without the clipping) and Adam. Small enough to read
in one sitting, real enough to show the whole contract: host state that crosses a warm switch,
deterministic sharded rollouts, gradients all-reduced over data-parallel trainers, weight sync.

Jobs file::

    workload: {kind: "digit_policy:LargestDigit", dataset: prompts.jsonl, batch: 16, group: 8}

with this folder on ``PYTHONPATH`` (every worker process imports the module itself).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from weave_rl import OptionError, Samples, Workload, phase

DIGITS = 10
PARAMS = ("w1", "b1", "w2", "b2")
DEFAULTS = {"dataset": "prompts.jsonl", "batch": 16, "group": 8, "hidden": 32, "lr": 0.02}


def read_rows(path: str) -> list[tuple[str, int]]:
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not str(row.get("prompt", "")).isdigit() or row.get("answer") not in range(DIGITS):
                raise ValueError(f"{path} line {n}: needs a digit string 'prompt' and a digit 'answer'")
            rows.append((row["prompt"], row["answer"]))
    return rows


class LargestDigit(Workload):
    # -- options: checked once, in the controller, before any worker starts ------------------------
    @classmethod
    def check_options(cls, options, base):
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            key = sorted(unknown)[0]
            raise OptionError(key, f"unknown option (known: {', '.join(DEFAULTS)})")
        out = {**DEFAULTS, **options}
        for key in ("batch", "group", "hidden"):
            if not isinstance(out[key], int) or out[key] < 1:
                raise OptionError(key, f"must be a positive integer, got {out[key]!r}")
        path = Path(out["dataset"])
        out["dataset"] = str(path if path.is_absolute() else base / path)  # workers get an absolute path
        if not Path(out["dataset"]).is_file():
            raise OptionError("dataset", f"{out['dataset']}: file not found")
        try:
            read_rows(out["dataset"])
        except (OSError, ValueError) as exc:
            raise OptionError("dataset", str(exc)) from None
        return out

    def __init__(self, job, options, seed):
        super().__init__(job, options, seed)
        o = {**DEFAULTS, **self.options}
        self.rows = read_rows(o["dataset"])
        self.batch, self.group, self.hidden, self.lr = o["batch"], o["group"], o["hidden"], float(o["lr"])
        self.dev: dict[str, dict[str, torch.Tensor]] = {}   # role -> tensors on the device
        self.host: dict[str, dict[str, torch.Tensor]] = {}  # role -> the host copy it came from
        self.pending = None  # weights synced before this process held any rollout state

    # -- state: plain dicts of CPU tensors, the same in every process for the same seed ------------
    def initial_state(self, role):
        g = torch.Generator().manual_seed(self.seed)
        state = {"w1": torch.randn(DIGITS, self.hidden, generator=g) / DIGITS ** 0.5, "b1": torch.zeros(self.hidden),
                 "w2": torch.randn(self.hidden, DIGITS, generator=g) / self.hidden ** 0.5, "b2": torch.zeros(DIGITS)}
        if role == "train":  # Adam's moments and step count travel with the weights
            state.update({f"{m}.{k}": torch.zeros_like(state[k]) for m in ("m", "v") for k in PARAMS})
            state["step"] = torch.zeros(())
        return state

    def to_device(self, role, state, device):
        self.host[role] = state
        self.dev[role] = {k: v.to(device, copy=True) for k, v in state.items()}  # a real copy, also on CPU
        if role == "rollout" and self.pending is not None:
            self.load_policy_weights(self.pending)
            self.pending = None

    def to_host(self, role):
        host = self.host[role]
        for k, v in self.dev.pop(role).items():
            host[k].copy_(v)
        return host

    def state_bytes(self, role):
        return sum(t.numel() * t.element_size() for t in self.initial_state(role).values())

    # -- weight sync ---------------------------------------------------------------------------------
    def policy_weights(self):
        src = self.dev.get("train") or self.host["train"]
        return {k: src[k].detach().to("cpu", copy=True) for k in PARAMS}

    def load_policy_weights(self, weights):
        target = self.dev.get("rollout") or self.host.get("rollout")
        if target is None:
            self.pending = {k: weights[k].clone() for k in PARAMS}
            return
        for k in PARAMS:
            target[k].copy_(weights[k])

    # -- phases --------------------------------------------------------------------------------------
    def features(self, prompt: str) -> torch.Tensor:
        counts = torch.zeros(DIGITS)
        for ch in prompt:
            counts[int(ch)] += 1
        return (counts > 0).float()

    def logits(self, p, x):
        return torch.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]

    def prompts(self, iteration: int) -> list[int]:
        """The iteration's rows: depend only on (seed, iteration), never on the shard layout."""
        return random.Random(f"{self.seed}/{iteration}").sample(range(len(self.rows)), self.batch)

    @phase("rollout")
    def rollout(self, iteration, shard, shards):
        p = self.dev["rollout"]
        rows = self.prompts(iteration)
        lo, hi = shard * len(rows) // shards, (shard + 1) * len(rows) // shards  # whole groups per shard
        x, action, logp, index = [], [], [], []
        with torch.no_grad():
            for i in range(lo, hi):
                feats = self.features(self.rows[rows[i]][0])
                probs = torch.softmax(self.logits(p, feats.to(p["w1"].device)), -1).cpu()
                g = torch.Generator().manual_seed(hash((self.seed, iteration, i)) & 0x7FFFFFFF)
                picks = torch.multinomial(probs, self.group, replacement=True, generator=g)
                x += [feats] * self.group
                action.append(picks)
                logp.append(torch.log(probs[picks]))
                index += [i] * self.group
        n = len(index)
        data = {"x": torch.stack(x) if x else torch.zeros(0, DIGITS),
                "action": torch.cat(action) if action else torch.zeros(0, dtype=torch.long),
                "logp": torch.cat(logp) if logp else torch.zeros(0),
                "prompt": torch.tensor(index, dtype=torch.long),
                "answer": torch.tensor([self.rows[rows[i]][1] for i in index], dtype=torch.long)}
        ids = [f"{self.job}/{iteration}/{shard}/{lo * self.group + j}" for j in range(n)]
        return Samples(self.job, iteration, shard, shards, data, count=n, tokens=n, ids=ids)

    @phase("reward")
    def reward(self, samples):
        """1 for the right answer; the advantage is the reward minus its prompt's group mean (a shard
        holds whole groups, so this is the place to compute it: train may split a group)."""
        r = (samples.data["action"] == samples.data["answer"]).float()
        groups = samples.data["prompt"].unique(return_inverse=True)[1]
        means = torch.zeros(len(r)).index_add_(0, groups, r)[: int(groups.max()) + 1] / self.group if len(r) else r
        samples.data["reward"] = r
        samples.data["advantage"] = r - means[groups] if len(r) else r
        if len(r):
            samples.stats["reward_mean"] = float(r.mean())
        return samples

    @phase("train")
    def train(self, iteration, samples, all_reduce):
        s = self.dev["train"]
        d = {k: v.to(s["w1"].device) for k, v in samples.data.items()}
        params = {k: s[k].detach().requires_grad_(True) for k in PARAMS}
        n = samples.count
        if n:
            logp = torch.log_softmax(self.logits(params, d["x"]), -1).gather(1, d["action"][:, None]).squeeze(1)
            loss = -(d["advantage"] * logp).sum()  # summed here, divided by the global count below
        else:
            loss = sum(v.sum() for v in params.values()) * 0.0
        grads = list(torch.autograd.grad(loss, [params[k] for k in PARAMS]))
        sums = torch.tensor([float(n), float(loss.detach()), float(d["reward"].sum())], device=s["w1"].device)
        all_reduce(grads + [sums])  # averaged over the phase's workers, in place
        count = float(sums[0])
        s["step"] += 1
        t = float(s["step"])
        with torch.no_grad():  # Adam on the mean gradient over every worker's responses
            for k, gk in zip(PARAMS, grads):
                gk /= max(count, 1e-12)
                s[f"m.{k}"].mul_(0.9).add_(gk, alpha=0.1)
                s[f"v.{k}"].mul_(0.999).addcmul_(gk, gk, value=0.001)
                s[k] -= self.lr * (s[f"m.{k}"] / (1 - 0.9 ** t)) / ((s[f"v.{k}"] / (1 - 0.999 ** t)).sqrt() + 1e-8)
        return {"loss": float(sums[1]) / max(count, 1e-12), "reward_mean": float(sums[2]) / max(count, 1e-12)}
