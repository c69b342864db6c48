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


def test_greedy_score_is_the_mean_reward_of_argmax_answers():
    from weave_rl.executor.rl import GRPOWorkload
    from weave_rl.executor.rl.evaluate import greedy_score
    from weave_rl.executor.rl.model import build_model, initial_params
    from weave_rl.executor.rl.vllm_engine import greedy_torch

    job = GRPOWorkload("T", {"task": "addition", "digits": 1}, 4)
    problems = [job.problem(0, p) for p in range(6)]
    weights = initial_params(job.opts, job.tokenizer, 3)  # another policy than the job's initial one
    model = build_model(job.opts, job.tokenizer, 4)
    model.load_state_dict(weights)
    by_hand = []
    for p in problems:  # one prompt at a time, no cache, plain argmax
        tokens, _ = greedy_torch(model, job._prompt_tokens(p), job.max_new_tokens, job.tokenizer.eos_id)
        text = job.tokenizer.decode([t for t in tokens if t != job.tokenizer.eos_id])
        by_hand.append(job.reward_fn(p.prompt, text, p.answer))
    assert sum(by_hand) > 0  # some credit to get right (this seed's policy earns 1/9)
    assert greedy_score(job, problems, weights, batch=4) == pytest.approx(sum(by_hand) / len(by_hand))
    with pytest.raises(ValueError, match="lack"):
        greedy_score(job, problems, {"lm_head.weight": weights["lm_head.weight"]})
