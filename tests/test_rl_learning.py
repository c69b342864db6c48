"""The GRPO job learns: mean reward rises over a short in-process run of the default options."""

import pytest
import torch

from weave_rl.executor.workload import build_workload

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def no_reduce(tensors):  # one worker: the all-reduce is the identity
    pass


def test_reward_rises_on_default_task():
    w = build_workload("A", {"kind": "grpo"}, default_seed=0)
    assert w.opts.task == "addition"
    w.to_device("rollout", w.initial_state("rollout"), CPU)
    w.to_device("train", w.initial_state("train"), CPU)
    rewards = []
    for it in range(30):
        samples = w.reward(w.rollout(it, 0, 1))
        metrics = w.train(it, samples, no_reduce)
        w.load_policy_weights(w.policy_weights())
        rewards.append(samples.stats["reward_mean"])
        assert metrics["samples"] == samples.count == 64
        assert abs(metrics["reward_mean"] - samples.stats["reward_mean"]) < 1e-6
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # A random policy scores ~0.05 (a right digit in the right place by chance); 30 steps reach ~0.15.
    assert last > first + 0.05, (first, last, rewards)
