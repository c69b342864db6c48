"""The grpo options checked in the controller, before any worker starts: what ``GRPOOptions`` cannot
see from the block alone (the model directory, the dataset's rows, the reward's import)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from weave_rl.executor.rl.data import load_problems
from weave_rl.executor.rl.model import SMOLLM2_LAYERS, model_dir_problem, smollm2_missing
from weave_rl.executor.rl.options import MODELS, GRPOOptions
from weave_rl.executor.rl.rewards import load_reward
from weave_rl.executor.rl.tokenizer import CharTokenizer
from weave_rl.executor.workload import OptionError


def _resolve(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else base / path)  # symlinks kept as the user named them


def check_options(options: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The grpo options as the workers get them, checked here (``OptionError`` naming the option):
    types and ranges, the model directory (config, weights, tokenizer of a causal LM), every row of
    the dataset (fields there, text the model's tokenizer can encode) and the reward's import.
    Relative paths (``model``, ``dataset``) are taken from ``base``, the jobs file's folder."""
    out = dict(options)
    if isinstance(out.get("model"), str) and out["model"] not in MODELS and out["model"].strip():
        out["model"] = _resolve(out["model"], base)
    if isinstance(out.get("dataset"), str) and out["dataset"]:
        out["dataset"] = _resolve(out["dataset"], base)
    opts = GRPOOptions.from_mapping(out)
    if opts.model == "smollm2":
        why = smollm2_missing()
        if why:
            raise OptionError("model", why)
    elif not opts.builtin_model:
        why = model_dir_problem(opts.model)
        if why:
            raise OptionError("model", why)
    layers = model_layers(opts)
    if opts.train_layers > layers:
        raise OptionError("train_layers", f"the model has {layers} transformer blocks, got {opts.train_layers}")
    if opts.dataset:
        problems = load_problems(opts.dataset, opts.prompt_field, opts.answer_field)
        if opts.model == "tiny":  # its char vocabulary: say which row does not fit, here
            tok = CharTokenizer()
            for i, pr in enumerate(problems):
                for key, text in (("prompt_field", pr.prompt), ("answer_field", pr.answer)):
                    bad = sorted(set(text) - set(tok.chars))
                    if bad:
                        raise OptionError(key, f"{opts.dataset} row {i}: {bad[0]!r} is not in the tiny model's "
                                               f"vocabulary {tok.chars!r} (use model: a model directory)")
    load_reward(opts.reward_name)
    return out


def model_layers(opts: GRPOOptions) -> int:
    """How many transformer blocks the job's model has (read from a model directory's config)."""
    if opts.model == "tiny":
        return opts.layers
    if opts.model == "smollm2":
        return SMOLLM2_LAYERS
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(opts.model, local_files_only=True).num_hidden_layers)
