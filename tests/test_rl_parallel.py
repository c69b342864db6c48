"""Determinism of prompts and samples, and data-parallel training equals single-worker training."""

import threading

import pytest
import torch

from weave_rl.executor.rl import GRPOWorkload, concat_samples

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make(opts=None, seed=7, roles=("rollout", "train")):
    w = GRPOWorkload("J", {"group_size": 4, "prompts_per_iteration": 4, **(opts or {})}, seed)
    for role in roles:
        w.to_device(role, w.initial_state(role), CPU)
    return w


class ThreadAllReduce:
    """An in-process collective: each worker thread deposits its list, all get the average."""

    def __init__(self, workers):
        self.barrier = threading.Barrier(workers)
        self.lists = {}

    def __call__(self, tensors):
        me = threading.get_ident()
        self.lists[me] = tensors
        self.barrier.wait()
        mean = [torch.stack(ts).mean(0) for ts in zip(*self.lists.values())]
        self.barrier.wait()  # everyone computed the mean before anyone writes
        for t, m in zip(tensors, mean):
            t.copy_(m)


def test_same_seed_same_samples_and_shards_differ():
    a, b = make(), make()
    s1, s2 = a.rollout(3, 1, 2), b.rollout(3, 1, 2)
    assert s1.ids == s2.ids == [f"J/3/1/{i}" for i in range(8, 16)]
    for key in s1.data:
        assert torch.equal(s1.data[key], s2.data[key]), key
    other = a.rollout(3, 0, 2)
    assert set(other.data["prompt_index"].tolist()) == {0, 1}
    assert set(s1.data["prompt_index"].tolist()) == {2, 3}
    assert not torch.equal(other.data["prompt_ids"], s1.data["prompt_ids"])
    assert not torch.equal(a.rollout(4, 1, 2).data["prompt_ids"], s1.data["prompt_ids"])  # next iteration
    assert a.problem(3, 2) != a.problem(3, 3)
    assert make(seed=8).problem(3, 2) != a.problem(3, 2)  # another seed, other prompts


def test_response_does_not_depend_on_shard_layout():
    w = make()
    full = w.rollout(5, 0, 1)
    halves = [w.rollout(5, s, 2) for s in range(2)]
    merged = concat_samples(halves)
    for key in ("prompt_ids", "response_ids", "response_mask", "prompt_index"):
        assert torch.equal(merged.data[key], full.data[key]), key
    assert torch.allclose(merged.data["old_logprobs"], full.data["old_logprobs"], atol=1e-5)
    assert merged.count == full.count and merged.tokens == full.tokens
    assert [i.rsplit("/", 1)[1] for i in merged.ids] == [i.rsplit("/", 1)[1] for i in full.ids]


def test_more_shards_than_prompts_gives_empty_share():
    w = make({"prompts_per_iteration": 1})
    empty = w.reward(w.rollout(0, 1, 2))
    assert empty.count == 0 and empty.tokens == 0 and empty.ids == []


@pytest.mark.parametrize("prompts", [4, 3])  # 3 prompts: an uneven split (2 + 1 groups)
def test_data_parallel_equals_single_worker(prompts):
    opts = {"prompts_per_iteration": prompts, "epochs": 2, "kl_coef": 0.1}
    roll = make(opts, roles=("rollout",))
    shards = [roll.reward(roll.rollout(0, s, 2)) for s in range(2)]
    whole = concat_samples(shards)

    single = make(opts, roles=("train",))
    captured_single = []
    m1 = single.train(0, whole, lambda ts: captured_single.append([t.clone() for t in ts]))

    workers = [make(opts, roles=("train",)) for _ in range(2)]
    reduce = ThreadAllReduce(2)
    captured = [[], []]
    results = [None, None]

    def run(k):
        def all_reduce(ts):
            reduce(ts)
            captured[k].append([t.clone() for t in ts])
        results[k] = workers[k].train(0, shards[k], all_reduce)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Gradient actually applied = averaged list / averaged count: the same in both set-ups.
    for epoch in range(2):
        g1 = [t / captured_single[epoch][-1][0] for t in captured_single[epoch][:-1]]
        g2 = [t / captured[0][epoch][-1][0] for t in captured[0][epoch][:-1]]
        assert max((a - b).abs().max().item() for a, b in zip(g1, g2)) < 1e-6
    w1, wa, wb = single.policy_weights(), workers[0].policy_weights(), workers[1].policy_weights()
    before = make(opts, roles=()).initial_state("rollout")
    for name in w1:
        assert torch.equal(wa[name], wb[name]), name  # workers stay in lockstep
        assert torch.allclose(w1[name], wa[name], atol=1e-5), name
    assert any(not torch.equal(w1[n], before[f"policy.{n}"]) for n in w1)  # the step did something
    for key in ("loss", "kl", "reward_mean"):
        assert results[0][key] == pytest.approx(m1[key], abs=1e-5), key
    assert results[0]["samples"] + results[1]["samples"] == m1["samples"] == 4 * prompts


def test_a_non_finite_gradient_skips_the_step_and_says_so():
    """A NaN old log-prob (a corrupt rollout) must not turn every weight into NaN for good: the step
    is skipped, counted in ``skipped_steps``, and the next good batch trains as usual."""
    roll = make(roles=("rollout",))
    samples = roll.reward(roll.rollout(0, 0, 1))
    trainer = make(roles=("train",))
    before = {k: v.clone() for k, v in trainer.policy_weights().items()}
    bad = samples.data["old_logprobs"].clone()
    bad[0, 0] = float("nan")
    poisoned = type(samples)(**{**samples.__dict__, "data": {**samples.data, "old_logprobs": bad}})
    metrics = trainer.train(0, poisoned, lambda ts: None)
    assert metrics["skipped_steps"] == 1.0
    after = trainer.policy_weights()
    assert all(torch.equal(before[k], after[k]) for k in before)
    metrics = trainer.train(1, samples, lambda ts: None)
    assert metrics["skipped_steps"] == 0.0
    assert any(not torch.equal(before[k], trainer.policy_weights()[k]) for k in before)
