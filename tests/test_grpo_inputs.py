"""The built-in grpo job on the user's inputs: a local Hugging Face model directory (with its own
tokenizer and chat template), a JSONL or parquet prompt dataset sharded deterministically per
iteration, built-in and imported rewards (a failing reward fails the phase, never silently), and
every bad option caught in the controller as one line naming the jobs file and key."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from weave_rl.core.errors import InputError
from weave_rl.executor.rl import GRPOWorkload
from weave_rl.executor.rl.data import PromptStream, load_problems
from weave_rl.executor.rl.rewards import RewardError, exact, numeric
from weave_rl.executor.workload import OptionError, build_workload, check_workload

CHARS = "0123456789+-*=?:. abcdefghijklmnopqrstuvwxyz"
TEMPLATE = "{% for m in messages %}<s>q:{{ m['content'] }}{% endfor %}{% if add_generation_prompt %} a:{% endif %}"


def make_model_dir(folder: Path, chat: bool = True, hidden_size: int = 32) -> Path:
    """A tiny Llama with a char-level fast tokenizer, saved the way a user's fine-tune is (no network)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    if chat:
        tok.chat_template = TEMPLATE
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


ROWS = [{"question": f"{a}+{b}=", "solution": a + b} for a, b in [(1, 2), (3, 4), (5, 5), (7, 1), (2, 9), (6, 6)]]


def write_jsonl(path: Path, rows=ROWS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def grpo(tmp_path: Path, **extra) -> dict:
    return {"kind": "grpo", "dataset": str(write_jsonl(tmp_path / "data.jsonl")), "prompt_field": "question",
            "answer_field": "solution", "prompts_per_iteration": 2, "group_size": 3, "max_new_tokens": 4, **extra}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("model") / "tiny-llama")


def run_iteration(wl: GRPOWorkload, k: int, shard: int = 0, shards: int = 1):
    wl.to_device("rollout", wl.initial_state("rollout") if "rollout" not in wl._slots or wl._slots["rollout"].host is None
                 else wl._slots["rollout"].host, torch.device("cpu"))
    samples = wl.reward(wl.rollout(k, shard, shards))
    wl.to_host("rollout")
    return samples


# -- datasets and sharding ----------------------------------------------------------------------------


def test_jsonl_and_parquet_give_the_same_problems(tmp_path):
    jsonl = load_problems(str(write_jsonl(tmp_path / "d.jsonl")), "question", "solution")
    pd.DataFrame(ROWS).to_parquet(tmp_path / "d.parquet")
    parquet = load_problems(str(tmp_path / "d.parquet"), "question", "solution")
    assert jsonl == parquet and len(jsonl) == 6
    assert jsonl[2].prompt == "5+5=" and jsonl[2].answer == "10"  # numeric answers read as text


def test_stream_covers_each_row_once_per_epoch_and_is_deterministic(tmp_path):
    problems = load_problems(str(write_jsonl(tmp_path / "d.jsonl")), "question", "solution")
    a, b = PromptStream(problems, 4, seed=7), PromptStream(problems, 4, seed=7)
    rows = [a.row(k, p) for k in range(3) for p in range(4)]  # 12 positions = 2 epochs of 6 rows
    assert sorted(rows[:6]) == list(range(6)) and sorted(rows[6:]) == list(range(6))
    assert rows[:6] != rows[6:] or rows[:6] != list(range(6))  # shuffled per epoch
    assert rows == [b.row(k, p) for k in range(3) for p in range(4)]  # same in every process
    assert rows != [PromptStream(problems, 4, seed=8).row(k, p) for k in range(3) for p in range(4)]
    plain = PromptStream(problems, 4, seed=7, shuffle=False)
    assert [plain.row(1, p) for p in range(4)] == [4, 5, 0, 1]  # positions 4..7 of file order


# -- model directory, rewards ---------------------------------------------------------------------------


def test_model_dir_uses_its_tokenizer_and_chat_template(tmp_path, model_dir, one_torch_thread):
    from transformers import AutoTokenizer

    wl = build_workload("A", {**grpo(tmp_path), "model": str(model_dir), "reward": "numeric"}, default_seed=3)
    tok = AutoTokenizer.from_pretrained(model_dir)
    pr = wl.problem(0, 0)
    assert wl._prompt_tokens(pr) == tok(f"<s>q:{pr.prompt} a:", add_special_tokens=False)["input_ids"]
    samples = run_iteration(wl, 0)
    assert samples.count == 6 and samples.data["prompt_ids"].shape[0] == 6
    # Rewards are the numeric rule applied to the decoded responses, by hand.
    for i in range(samples.count):
        text = tok.decode(samples.data["response_ids"][i][samples.data["response_mask"][i]].tolist(),
                          skip_special_tokens=True)
        p = wl.problem(0, int(samples.data["prompt_index"][i]))
        assert float(samples.data["rewards"][i]) == numeric(p.prompt, text, p.answer)
    # Train: one real optimizer step changes the weights the trainer hands to a sync.
    wl.to_device("train", wl.initial_state("train"), torch.device("cpu"))
    before = {n: t.clone() for n, t in wl.policy_weights().items()}
    samples.data["advantages"] = torch.linspace(-1, 1, samples.count)  # a signal even if all rewards tie
    metrics = wl.train(0, samples, lambda tensors: None)
    after = wl.policy_weights()
    assert metrics["samples"] == 6 and metrics["grad_norm"] > 0
    assert any(not torch.equal(before[n], after[n]) for n in before)
    no_chat = build_workload("B", {**grpo(tmp_path), "model": str(model_dir), "chat_template": False})
    assert no_chat._prompt_tokens(pr) == [tok.bos_token_id] + tok(pr.prompt, add_special_tokens=False)["input_ids"]


def test_shards_of_a_rollout_are_the_single_shard_split(tmp_path, model_dir, one_torch_thread):
    block = {**grpo(tmp_path), "model": str(model_dir), "prompts_per_iteration": 3}
    one = run_iteration(build_workload("A", block), 1)
    parts = [run_iteration(build_workload("A", block), 1, s, 2) for s in (0, 1)]
    assert [p.count for p in parts] == [6, 3]
    assert torch.equal(torch.cat([p.data["rewards"] for p in parts]), one.data["rewards"])
    assert torch.equal(torch.cat([p.data["prompt_index"] for p in parts]), one.data["prompt_index"])


def test_builtin_rules():
    assert exact("", " 42 ", "42") == 1.0 and exact("", "42.", "42") == 0.0
    assert numeric("", "the answer is 1,234", "1234") == 1.0 and numeric("", "12 then 13", "12") == 0.0
    assert numeric("", "no number", "3") == 0.0


def reward_module(tmp_path: Path, monkeypatch, body: str) -> str:
    name = f"user_reward_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_imported_reward_scores_every_response(tmp_path, monkeypatch, one_torch_thread):
    mod = reward_module(tmp_path, monkeypatch, """
        def score(prompt, response, answer):
            return len(response) + 10 * len(prompt)
    """)
    wl = build_workload("A", {**grpo(tmp_path), "reward": f"{mod}:score"})  # tiny model, char vocabulary
    samples = run_iteration(wl, 2)
    for i in range(samples.count):
        text = wl.response_text(samples.data["response_ids"][i], samples.data["response_mask"][i])
        prompt = wl.problem(2, int(samples.data["prompt_index"][i])).prompt
        assert float(samples.data["rewards"][i]) == len(text) + 10 * len(prompt)


@pytest.mark.parametrize("body, message", [
    ("def score(p, r, a):\n    return 1 / 0\n", r"reward \S+:score raised ZeroDivisionError: division by zero on "
                                                r"response A/0/0/0 of job A \(prompt '\d\+\d='"),
    ("def score(p, r, a):\n    return 'high'\n", r"reward \S+:score returned 'high' \(str\), not a finite number"),
    ("def score(p, r, a):\n    return float('nan')\n", r"returned nan \(float\), not a finite number"),
    ("def score(p, r, a):\n    return None\n", r"returned None \(NoneType\)"),
])
def test_failing_reward_fails_the_phase(tmp_path, monkeypatch, body, message, one_torch_thread):
    mod = reward_module(tmp_path, monkeypatch, body)
    wl = build_workload("A", {**grpo(tmp_path), "reward": f"{mod}:score"})
    with pytest.raises(RewardError, match=message):
        run_iteration(wl, 0)


# -- checks in the controller ------------------------------------------------------------------------------


@pytest.mark.parametrize("change, key, reason", [
    ({"lr": "fast"}, "lr", "must be float, got 'fast'"),
    ({"learning_rate": 1e-3}, "learning_rate", "unknown option (known: "),
    ({"dataset": "missing.jsonl"}, "dataset", "missing.jsonl: file not found"),
    ({"dataset": "data.csv"}, "dataset", "unknown format '.csv'"),
    ({"prompt_field": "prompt"}, "prompt_field", "line 1 has no field 'prompt' (its fields: question, solution)"),
    ({"answer_field": "answer"}, "answer_field", "line 1 has no field 'answer'"),
    ({"task": "sort"}, "task", "a synthetic task and a dataset exclude each other"),
    ({"reward": "close_enough"}, "reward", "unknown reward 'close_enough' (built-in: partial, exact, numeric"),
    ({"reward": "no_such_module_xyz:f"}, "reward", "cannot import 'no_such_module_xyz'"),
    ({"model": "no-such-model"}, "model", "no-such-model: no such directory"),
    ({"train_layers": 3}, "train_layers", "the model has 2 transformer blocks, got 3"),
    ({"train_layers": -1}, "train_layers", "must be >= 0, got -1"),
])
def test_bad_options_are_named(tmp_path, change, key, reason):
    block = {**grpo(tmp_path), **change}
    with pytest.raises(OptionError) as info:
        check_workload(block, tmp_path)
    assert info.value.key == key and reason in info.value.reason, info.value.reason


def test_tiny_model_vocabulary_and_parquet_columns_checked(tmp_path):
    write_jsonl(tmp_path / "words.jsonl", [{"question": "two plus two?", "solution": "4"}])
    with pytest.raises(OptionError, match="row 0: ' ' is not in the tiny model's vocabulary") as info:
        check_workload({**grpo(tmp_path), "dataset": "words.jsonl"}, tmp_path)
    assert info.value.key == "prompt_field"
    pd.DataFrame(ROWS).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(OptionError, match=r"no column 'prompt' in .*d.parquet \(its columns: question, solution\)"):
        check_workload({**grpo(tmp_path), "dataset": "d.parquet", "prompt_field": "prompt"}, tmp_path)


def test_model_dir_problems(tmp_path, model_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OptionError, match="no config.json"):
        check_workload({**grpo(tmp_path), "model": "empty"}, tmp_path)
    no_tok = tmp_path / "no-tok"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tok / name).write_bytes((model_dir / name).read_bytes())
    with pytest.raises(OptionError, match="no tokenizer"):
        check_workload({**grpo(tmp_path), "model": str(no_tok)}, tmp_path)


def test_relative_paths_resolve_against_the_jobs_folder(tmp_path, model_dir):
    (tmp_path / "m").symlink_to(model_dir)
    block = check_workload({**grpo(tmp_path), "dataset": "data.jsonl", "model": "m", "seed": 5}, tmp_path)
    assert block["dataset"] == str(tmp_path / "data.jsonl") and block["model"] == str(tmp_path / "m")
    assert block["kind"] == "grpo" and block["seed"] == 5
    assert check_workload(None, tmp_path) is None  # no block: the default grpo job, nothing to resolve


def test_load_run_inputs_reports_bad_grpo_option_before_workers(tmp_path):
    from weave_rl.executor.inputs import load_run_inputs
    from tests.test_local_run import write_inputs

    plan, jobs = write_inputs(tmp_path / "in", grpo=True)
    write_jsonl(tmp_path / "in" / "data.jsonl")
    text = jobs.read_text()
    block = ("    workload: {kind: grpo, dataset: data.jsonl, prompt_field: question, answer_field: answer}\n")
    first_b = text.index("  - name: B")
    jobs.write_text(text[:first_b] + block + text[first_b:])
    with pytest.raises(InputError) as info:
        load_run_inputs(plan, jobs, None)
    assert str(info.value) == (f"{jobs}: jobs[0].workload.answer_field: {tmp_path / 'in' / 'data.jsonl'} line 1 "
                               "has no field 'answer' (its fields: question, solution)")
    jobs.write_text(text[:first_b] + block.replace("answer_field: answer", "answer_field: solution") + text[first_b:])
    _, _, loaded = load_run_inputs(plan, jobs, None)
    assert loaded["A"].workload["dataset"] == str(tmp_path / "in" / "data.jsonl")  # what the workers get
    assert loaded["B"].workload is None


def test_failing_reward_stops_the_run_with_the_reason(tmp_path):
    """weave run with an imported reward returning a dict: the first rollout fails, the run exits 1
    with the reward's name, the response and the prompt in its error, and writes no metrics."""
    import os
    import subprocess

    from tests.test_local_run import WEAVE, write_inputs

    plan, jobs = write_inputs(tmp_path / "in", grpo=True)
    write_jsonl(tmp_path / "in" / "data.jsonl")
    (tmp_path / "bad_reward.py").write_text("def score(prompt, response, answer):\n    return {'r': 1}\n")
    block = ("    workload: {kind: grpo, dataset: data.jsonl, prompt_field: question, answer_field: solution, "
             "reward: 'bad_reward:score', prompts_per_iteration: 2, group_size: 2, max_new_tokens: 4}\n")
    text = jobs.read_text()
    first_b = text.index("  - name: B")
    jobs.write_text(text[:first_b] + block + text[first_b:] + block)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([*WEAVE, "run", str(plan), "--jobs", str(jobs), "--iterations", "2", "--out",
                           str(tmp_path / "run"), "--no-plots"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rollout of A iteration 0 failed" in proc.stderr or "rollout of B iteration 0 failed" in proc.stderr
    assert ("RewardError: reward bad_reward:score returned {'r': 1} (dict), not a finite number, on response "
            in proc.stderr), proc.stderr[-3000:]
    assert not (tmp_path / "run" / "job_metrics.csv").exists()
    # The run log (journal) keeps the failure with its reason, for --resume and for the report.
    import json

    entries = [json.loads(line) for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    failed = [e for e in entries if e.get("event") == "phase_failed"]
    assert len(failed) == 1 and failed[0]["phase"] == "rollout" and failed[0]["iteration"] == 0
    assert "RewardError: reward bad_reward:score returned {'r': 1} (dict)" in failed[0]["error"]
