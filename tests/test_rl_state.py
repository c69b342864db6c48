"""Warm switch and weight sync of the GRPO job: what moves, that it round-trips, that sync lands."""

import pytest
import torch

from weave_rl.executor.rl import GRPOWorkload

CPU = torch.device("cpu")
OPTS = {"group_size": 4, "prompts_per_iteration": 2}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def no_reduce(tensors):
    pass


def step(trainer, roller, iteration):
    """One on-policy iteration: rollout on ``roller``, train on ``trainer``, sync back."""
    metrics = trainer.train(iteration, roller.reward(roller.rollout(iteration, 0, 1)), no_reduce)
    roller.load_policy_weights(trainer.policy_weights())
    return metrics


def on_device(opts=None, seed=3, roles=("rollout", "train")):
    w = GRPOWorkload("J", {**OPTS, **(opts or {})}, seed)
    for role in roles:
        w.to_device(role, w.initial_state(role), CPU)
    return w


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_initial_state_is_seeded_and_independent_of_global_rng():
    a = GRPOWorkload("J", OPTS, 5).initial_state("rollout")
    torch.manual_seed(1234)
    torch.rand(1000)
    assert_same(a, GRPOWorkload("K", OPTS, 5).initial_state("rollout"))
    other = GRPOWorkload("J", OPTS, 6).initial_state("rollout")
    assert any(not torch.equal(a[k], other[k]) for k in a)


def test_state_keys_and_bytes():
    w = GRPOWorkload("J", OPTS, 0)
    roll, train = w.initial_state("rollout"), w.initial_state("train")
    policy = {k for k in roll}
    assert policy and all(k.startswith("policy.") for k in policy)
    assert policy < set(train)
    assert {k.rsplit(".", 1)[1] for k in set(train) - policy} == {"exp_avg", "exp_avg_sq", "step"}
    for role, state in (("rollout", roll), ("train", train)):
        assert w.state_bytes(role) == sum(t.nbytes for t in state.values())
    # train = weights + two Adam moments (+ a 4-byte step per tensor)
    assert w.state_bytes("train") == 3 * w.state_bytes("rollout") + 4 * len(roll)
    kl = GRPOWorkload("J", {**OPTS, "kl_coef": 0.1}, 0)
    ref = {k for k in kl.initial_state("train") if k.startswith("ref.")}
    assert len(ref) == len(roll)
    assert kl.state_bytes("train") == w.state_bytes("train") + w.state_bytes("rollout")


def test_round_trip_keeps_weights_and_optimizer_state():
    a = on_device()
    b = on_device()
    for it in range(2):
        step(a, a, it)
        step(b, b, it)
    host = a.to_host("train")
    assert host["optim.model.embed_tokens.weight.step"].item() == 2.0
    assert host["optim.model.embed_tokens.weight.exp_avg"].abs().sum() > 0
    with pytest.raises(RuntimeError, match="not on a device"):
        a.model("train")
    with pytest.raises(RuntimeError, match="not on a device"):
        a.train(2, a.reward(a.rollout(2, 0, 1)), no_reduce)
    copy = {k: t.clone() for k, t in host.items()}
    a.to_device("train", host, CPU)
    assert_same(a.to_host("train"), copy)  # nothing changes on the way through
    a.to_device("train", copy, CPU)
    # the reloaded trainer continues exactly like one that never left the device
    m_a, m_b = step(a, a, 2), step(b, b, 2)
    assert m_a == m_b
    assert_same(a.policy_weights(), b.policy_weights())
    assert_same(a.to_host("train"), b.to_host("train"))


def test_to_device_rejects_wrong_state():
    w = GRPOWorkload("J", OPTS, 0)
    with pytest.raises(ValueError, match="state does not match"):
        w.to_device("train", w.initial_state("rollout"), CPU)
    w.to_device("rollout", w.initial_state("rollout"), CPU)
    with pytest.raises(RuntimeError, match="already on"):
        w.to_device("rollout", w.initial_state("rollout"), CPU)
    with pytest.raises(ValueError, match="unknown role"):
        w.initial_state("critic")


def test_weight_sync_gives_trainer_logits():
    trainer = on_device(roles=("train",))
    roller = on_device(roles=("rollout",))
    step(trainer, roller, 0)
    ids = torch.tensor([[1, 3, 4, 13, 5, 6, 16]])
    with torch.no_grad():
        want = trainer.model("train")(input_ids=ids).logits
        got = roller.model("rollout")(input_ids=ids).logits
    assert torch.equal(want, got)
    initial = roller.initial_state("rollout")["policy.lm_head.weight"]
    assert not torch.equal(initial, trainer.policy_weights()["lm_head.weight"])
    # and the same samples from the same seeds
    s1 = roller.rollout(1, 0, 1)
    roller2 = on_device(roles=("rollout",))
    roller2.load_policy_weights(trainer.policy_weights())
    assert torch.equal(s1.data["response_ids"], roller2.rollout(1, 0, 1).data["response_ids"])


def test_load_policy_weights_while_offloaded_lands_on_next_to_device():
    trainer = on_device(roles=("train",))
    roller = on_device(roles=("rollout",))
    step(trainer, roller, 0)
    host = roller.to_host("rollout")
    trainer.train(1, roller.reward(_rollout_on(roller, host, 1)), no_reduce)
    new = trainer.policy_weights()
    roller.load_policy_weights(new)  # offloaded: goes into the host copy
    assert torch.equal(host["policy.lm_head.weight"], new["lm_head.weight"])
    roller.to_device("rollout", host, CPU)
    got = dict(roller.model("rollout").named_parameters())
    for name, t in new.items():
        assert torch.equal(got[name].detach(), t), name


def _rollout_on(w, host, iteration):
    w.to_device("rollout", host, CPU)
    samples = w.rollout(iteration, 0, 1)
    host.update(w.to_host("rollout"))
    return samples


def test_weights_synced_before_any_rollout_state_apply_at_to_device():
    trainer = on_device(roles=("train",))
    step(trainer, on_device(roles=("rollout",)), 0)
    fresh = GRPOWorkload("J", OPTS, 3)
    fresh.load_policy_weights(trainer.policy_weights())
    fresh.to_device("rollout", GRPOWorkload("J", OPTS, 3).initial_state("rollout"), CPU)
    got = dict(fresh.model("rollout").named_parameters())
    for name, t in trainer.policy_weights().items():
        assert torch.equal(got[name].detach(), t), name
    with pytest.raises(ValueError, match="do not match"):
        fresh.load_policy_weights({"nope": torch.zeros(1)})


def test_kl_to_frozen_reference():
    w = on_device({"kl_coef": 0.5})
    first = step(w, w, 0)
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before the first step
    second = step(w, w, 1)
    assert second["kl"] > 0
    host = w.to_host("train")
    init = GRPOWorkload("J", OPTS, 3).initial_state("rollout")
    assert torch.equal(host["ref.lm_head.weight"], init["policy.lm_head.weight"])  # the reference stays put
    assert not torch.equal(host["policy.lm_head.weight"], init["policy.lm_head.weight"])


def test_samples_contents():
    w = on_device()
    s = w.reward(w.rollout(0, 0, 1))
    d = s.data
    assert s.count == 8 == len(s.ids) == d["response_ids"].shape[0]
    assert s.tokens == int(d["response_mask"].sum()) > 0
    assert d["old_logprobs"][~d["response_mask"]].abs().sum() == 0
    assert (d["old_logprobs"][d["response_mask"]] < 0).all()
    assert 0 <= s.stats["reward_mean"] <= 1
    for p in range(2):  # advantages are centred within each prompt's group
        assert d["advantages"][d["prompt_index"] == p].sum().abs() < 1e-4
    # old log-probs match the trainer's teacher-forced ones (same weights): first ratio is 1
    from weave_rl.executor.rl.sampling import response_logprobs
    with torch.no_grad():
        lp = response_logprobs(w.model("train"), d["prompt_ids"], d["prompt_mask"], d["response_ids"],
                               d["response_mask"], temperature=1.0)
    assert torch.allclose(lp[d["response_mask"]], d["old_logprobs"][d["response_mask"]], atol=1e-4)


def test_train_layers_updates_only_the_last_blocks_and_what_follows():
    from weave_rl.executor.rl.model import trainable_names

    names = ["model.embed_tokens.weight", "model.layers.0.mlp.w", "model.layers.1.mlp.w", "model.layers.2.mlp.w",
             "model.norm.weight", "lm_head.weight"]
    assert trainable_names(names, 0) == names
    assert trainable_names(names, 1) == ["model.layers.2.mlp.w", "model.norm.weight", "lm_head.weight"]
    assert trainable_names(names, 3) == names[1:]  # a tied head is the embedding: frozen with it
    with pytest.raises(ValueError, match="no transformer blocks"):
        trainable_names(["w", "b"], 1)

    opts = {"layers": 3, "train_layers": 1}
    w = on_device(opts)
    full = GRPOWorkload("J", {**OPTS, "layers": 3}, 3)
    before = w.policy_weights()
    for it in range(2):
        step(w, w, it)
    after = w.policy_weights()
    trained = {n for n in after if not torch.equal(before[n], after[n])}
    assert trained == {n for n in after if n.startswith(("model.layers.2.", "model.norm.", "lm_head."))}
    host = w.to_host("train")
    optim = {k.rsplit(".", 1)[0].removeprefix("optim.") for k in host if k.startswith("optim.")}
    assert optim == trained  # Adam moments only for what trains: the state is smaller by the frozen moments
    frozen_bytes = sum(t.nbytes for n, t in before.items() if n not in trained)
    assert w.state_bytes("train") == full.state_bytes("train") - 2 * frozen_bytes - 4 * (len(before) - len(trained))
    assert host["optim.lm_head.weight.step"].item() == 2.0
