"""Tokenizers the GRPO job speaks: a char-level one for the synthetic tasks, a wrapper for HF ones.

The char tokenizer needs no download and keeps the vocabulary tiny (a random tiny Llama over ~20
symbols gets partial credit by chance, so rewards have signal from the first iteration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

UNKNOWN = "?"  # how a special token reads back inside a response; never part of an answer


class TextTokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class CharTokenizer:
    """One id per character: PAD=0, BOS=1, EOS=2, then digits, operators and separators."""

    chars: str = "0123456789+-*=>:,|"
    pad_id: int = 0
    bos_id: int | None = 1
    eos_id: int = 2
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(set(self.chars)) != len(self.chars):
            raise ValueError(f"CharTokenizer: repeated characters in {self.chars!r}")
        object.__setattr__(self, "_index", {c: i + 3 for i, c in enumerate(self.chars)})

    @property
    def vocab_size(self) -> int:
        return 3 + len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._index[c] for c in text]
        except KeyError as err:
            raise ValueError(f"CharTokenizer: character {err.args[0]!r} is not in {self.chars!r}") from None

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i - 3] if 3 <= i < self.vocab_size else UNKNOWN for i in ids)


class HFTokenizer:
    """A transformers tokenizer behind the same small interface (``model: smollm2`` or a directory)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.vocab_size = len(tok)
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        self.bos_id = int(tok.bos_token_id) if tok.bos_token_id is not None else None

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def chat_prompt(self, text: str) -> list[int]:
        """The ids of ``text`` as one user turn in the tokenizer's chat template, ready for the
        assistant's answer (the template brings its own special tokens)."""
        out = self.tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=True)
        if isinstance(out, Mapping) or hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
            out = out["input_ids"]
        return [int(i) for i in out]
