"""Small in-memory tokenizers for the pipeline tests, and the on-disk fixture tokenizers.

`byte_level()` is a GPT-2-style byte-level BPE (as Qwen, Llama 3 and DeepSeek use);
`sentencepiece()` is a Llama-2/Mistral-style BPE over `▁`-marked text with byte fallback, whose
decoder strips the leading space — the case the prefix window of incremental decoding is for.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from smg.pipeline.tokenizers import Tokenizer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURE_NAMES = ("qwen3", "llama3", "deepseek", "mistral")

CORPUS = [
    "There is no single answer to the meaning of life.",
    "The quick brown fox jumps over the lazy dog. Hello world!",
    "Let me check the weather in Paris for you.",
    '{"city": "Paris", "unit": "celsius"}',
    "STOP here END of text. café naïve résumé 你好世界 こんにちは 😀🎉",
]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# A string-format template (no loop over message content) with a default-on
# `enable_thinking` toggle, tools and tool calls, Qwen-style.
STRING_TEMPLATE = (
    "{% if tools %}<|im_start|>system{{ '\\n' }}TOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "<|im_end|>{{ '\\n' }}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}{{ '\\n' }}"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{% if m.content is none %}NONE{% else %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }}:{{ c.function.arguments | tojson }}"
    "</call>{% endfor %}{% endif %}"
    "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}<|im_end|>{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}"
)

# DeepSeek-V3.1-style: a bare `thinking` variable that defaults to off.
BARE_THINKING_TEMPLATE = (
    "{% if not thinking is defined %}{% set thinking = false %}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}"
)

# An "openai"-format template: loops over each message's content parts.
PARTS_TEMPLATE = (
    "{% for message in messages %}[{{ message.role }}]"
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{% for part in message.content %}"
    "{% if part.type == 'text' %}{{ part.text }}{% else %}<img>{% endif %}|"
    "{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def _wrap(rust: RustTokenizer, template: str | None, **special: str) -> Tokenizer:
    hf = PreTrainedTokenizerFast(tokenizer_object=rust, chat_template=template, **special)  # type: ignore[no-untyped-call]
    return Tokenizer(hf, source="memory", name="toy")


@cache
def _byte_level_rust() -> RustTokenizer:
    rust = RustTokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rust.train_from_iterator(CORPUS * 20, trainer)
    return rust


def byte_level(template: str | None = STRING_TEMPLATE) -> Tokenizer:
    """A byte-level BPE whose EOS is `<|im_end|>`."""
    return _wrap(_byte_level_rust(), template, eos_token="<|im_end|>", pad_token="<|endoftext|>")


@cache
def _sentencepiece_rust() -> RustTokenizer:
    vocab: dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;(){}":
        vocab[char] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "w"), ("o", "r"), ("▁w", "or"), ("l", "d"), ("▁wor", "ld")]
    merges += [("i", "n"), ("▁", "a"), ("e", "r"), ("o", "n"), ("▁", "s"), ("t", "o"), ("▁s", "to"), ("▁sto", "p")]
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    rust = RustTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    rust.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    rust.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    rust.add_special_tokens(["<unk>", "<s>", "</s>"])
    return rust


def sentencepiece(template: str | None = None) -> Tokenizer:
    """A Llama-2-style BPE with byte fallback; EOS `</s>`."""
    return _wrap(_sentencepiece_rust(), template, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def fixture_path(name: str) -> Path:
    path = FIXTURES / name
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"fixture tokenizer {name} not present")
    return path


@cache
def _fixture(name: str) -> Tokenizer:
    return Tokenizer.load(fixture_path(name))


def fixture(name: str) -> Tokenizer:
    """A fixture tokenizer under tests/fixtures (the test is skipped when it is missing)."""
    fixture_path(name)
    return _fixture(name)
