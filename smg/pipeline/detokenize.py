"""Incremental detokenization: output token ids in, newly certain text out.

The prefix/read-offset technique (vLLM, HF `TextStreamer`): each push decodes only a short window
— the tokens already emitted since the last boundary (the prefix) plus the new ones — and emits
the difference between the two decodes. Decoding with context keeps word-boundary spacing
right for byte-level BPE and SentencePiece decoders, and a window whose text ends in U+FFFD is
held back, as its last character is still incomplete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class Detokenizer:
    """Text of a growing token sequence, emitted once certain. The concatenation of everything
    `push` and `flush` return equals `decode(all ids)`."""

    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # Only the window is kept: ids before `_prefix` never take part in a decode again.
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, ids: Sequence[int]) -> str:
        """Append `ids`; return the text they made certain (maybe "")."""
        if not ids:
            return ""
        self._ids.extend(ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""
        del self._ids[: self._read]
        self._prefix, self._read = 0, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """The held-back text at the end of the sequence (an incomplete character as U+FFFD)."""
        if self._read == len(self._ids):
            # Nothing held back (the prefix and the window are the same ids): no text to add.
            self._ids.clear()
            self._prefix = self._read = 0
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._ids.clear()
        self._prefix = self._read = 0
        return new_text[len(prefix_text) :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""
