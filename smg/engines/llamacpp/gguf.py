"""The key/value metadata at the head of a GGUF file (format version 2 and 3), read without numpy.

Only the header is read, never the tensors: a 100 MB model's metadata reads in well under a
second. Arrays of numbers come back as lists, arrays of strings as lists of str; keys keep
llama.cpp's names (`general.architecture`, `tokenizer.ggml.tokens`, …).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1),  # uint8
    1: ("b", 1),  # int8
    2: ("H", 2),  # uint16
    3: ("h", 2),  # int16
    4: ("I", 4),  # uint32
    5: ("i", 4),  # int32
    6: ("f", 4),  # float32
    7: ("?", 1),  # bool
    10: ("Q", 8),  # uint64
    11: ("q", 8),  # int64
    12: ("d", 8),  # float64
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.at = 0

    def unpack(self, fmt: str, size: int) -> Any:
        if self.at + size > len(self.data):
            raise GGUFError("the file ends inside its metadata")
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        length = self.unpack("Q", 8)
        end = self.at + length
        if end > len(self.data):
            raise GGUFError("the file ends inside a string")
        text = bytes(self.data[self.at : end]).decode("utf-8", errors="replace")
        self.at = end
        return text

    def array(self, kind: int, count: int) -> list[Any]:
        if kind in _SCALARS:
            fmt, size = _SCALARS[kind]
            if self.at + size * count > len(self.data):
                raise GGUFError("the file ends inside an array")
            values = list(struct.unpack_from(f"<{count}{fmt}", self.data, self.at))
            self.at += size * count
            return values
        read = self._reader(kind)
        return [read() for _ in range(count)]

    def value(self, kind: int) -> Any:
        if kind == _ARRAY:
            inner = self.unpack("I", 4)
            count = self.unpack("Q", 8)
            return self.array(inner, count)
        return self._reader(kind)()

    def _reader(self, kind: int) -> Callable[[], Any]:
        if kind == _STRING:
            return self.string
        if kind in _SCALARS:
            fmt, size = _SCALARS[kind]
            return lambda: self.unpack(fmt, size)
        if kind == _ARRAY:
            return lambda: self.value(_ARRAY)
        raise GGUFError(f"unknown GGUF value type {kind}")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata key of the GGUF file at `path`, with `GGUF.version` and `GGUF.tensor_count`."""
    with open(path, "rb") as file:
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != MAGIC:
                raise GGUFError(f"{path} is not a GGUF file")
            cursor = _Cursor(data)
            cursor.at = 4
            version = cursor.unpack("I", 4)
            if version < 2:
                raise GGUFError(f"GGUF version {version} is too old (2 or later is read)")
            metadata: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": cursor.unpack("Q", 8)}
            for _ in range(cursor.unpack("Q", 8)):
                key = cursor.string()
                metadata[key] = cursor.value(cursor.unpack("I", 4))
            return metadata


# Control tokens llama.cpp ends a generation on by their text, as well as the ids the file names.
_END_OF_GENERATION = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
# The file's `general.sampling.*` keys (written by newer converters) as generation_config names.
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF file says about its model, in the names the engine protocols use."""

    name: str
    architecture: str
    architectures: list[str]
    context_length: int
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    chat_template: str | None
    sampling_defaults: dict[str, float]

    @classmethod
    def of(cls, metadata: dict[str, Any]) -> ModelFacts:
        arch = str(metadata.get("general.architecture") or "")
        tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
        types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [])
        eos: list[int] = []
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            value = metadata.get(key)
            if isinstance(value, int) and value not in eos:
                eos.append(value)
        for index, (text, kind) in enumerate(zip(tokens, types)):
            if kind == 3 and text in _END_OF_GENERATION and index not in eos:  # 3: a control token
                eos.append(index)
        template = metadata.get("tokenizer.chat_template")
        sampling = {
            name: float(metadata[key])
            for key, name in _SAMPLING_KEYS.items()
            if isinstance(metadata.get(key), int | float) and not isinstance(metadata.get(key), bool)
        }
        return cls(
            name=str(metadata.get("general.name") or ""),
            architecture=arch,
            architectures=[_ARCHITECTURES[arch]] if arch in _ARCHITECTURES else [],
            context_length=int(metadata.get(f"{arch}.context_length") or 0),
            vocab_size=int(metadata.get(f"{arch}.vocab_size") or len(tokens)),
            bos_token_id=_optional_int(metadata.get("tokenizer.ggml.bos_token_id")),
            eos_token_ids=eos,
            pad_token_id=_optional_int(metadata.get("tokenizer.ggml.padding_token_id")),
            chat_template=template if isinstance(template, str) and template else None,
            sampling_defaults=sampling,
        )


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
