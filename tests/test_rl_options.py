"""The grpo workload block: validation, registry, tasks and scores."""

import random

import pytest

from weave_rl.executor.rl import GRPOOptions, GRPOWorkload
from weave_rl.executor.rl.tasks import Task, score
from weave_rl.executor.rl.tokenizer import CharTokenizer
from weave_rl.executor.workload import build_workload


def test_build_workload_grpo():
    w = build_workload("A", {"kind": "grpo", "task": "sort", "seed": 4})
    assert isinstance(w, GRPOWorkload) and w.job == "A" and w.seed == 4 and w.opts.task == "sort"
    assert set(w.phases()) == {"rollout", "reward", "train"}
    assert isinstance(build_workload("B", None), GRPOWorkload)  # grpo is the default kind


def test_build_workload_unknown_kind():
    with pytest.raises(ValueError, match="unknown workload kind 'ppo'.*grpo"):
        build_workload("A", {"kind": "ppo"})


@pytest.mark.parametrize("block, message", [
    ({"learning_rate": 0.1}, r"unknown option 'learning_rate' \(known: .*lr"),
    ({"task": "chess"}, "'task' must be one of addition, sort, copy"),
    ({"model": "gpt5"}, "option 'model': gpt5: no such directory"),
    ({"clip": 1.5}, r"'clip' must be in \(0, 1\)"),
    ({"group_size": 0}, "'group_size' must be >= 1"),
    ({"group_size": 2.5}, "'group_size' must be int"),
    ({"temperature": 0}, "'temperature' must be > 0"),
    ({"lr": "fast"}, "'lr' must be float"),
    ({"hidden_size": 30, "heads": 4}, "'hidden_size' must be a multiple of heads"),
])
def test_bad_options(block, message):
    with pytest.raises(ValueError, match=message):
        build_workload("A", {"kind": "grpo", **block})


def test_int_accepted_for_float_option():
    assert GRPOOptions.from_mapping({"lr": 1, "kl_coef": 0}).lr == 1.0


def test_tasks_are_verifiable():
    rng = random.Random(0)
    for _ in range(20):
        p = Task("addition", 3).problem(rng.randrange(1 << 60))
        a, b = p.prompt[:-1].split("+")
        assert int(p.answer) == int(a) + int(b) and len(p.answer) == 4 and len(p.prompt) == 8
        s = Task("sort", 5).problem(rng.randrange(1 << 60))
        assert s.answer == "".join(sorted(s.prompt[:-1]))
        c = Task("copy", 4).problem(rng.randrange(1 << 60))
        assert c.prompt == c.answer + ":"


def test_score_partial_credit():
    assert score("0123", "0123") == 1.0
    assert score("0123", "0193") == 0.75
    assert score("0123", "01") == 0.5           # too short
    assert score("0123", "01230000") == 0.5     # too long is penalised too
    assert score("0123", "") == 0.0


def test_char_tokenizer_round_trip():
    tok = CharTokenizer()
    ids = tok.encode("12+34=")
    assert tok.decode(ids) == "12+34=" and min(ids) >= 3
    assert tok.decode([tok.eos_id]) == "?"
    with pytest.raises(ValueError, match="not in"):
        tok.encode("x")
