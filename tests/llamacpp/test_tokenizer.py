"""The tokenizer exported from the GGUF against llama.cpp's own, on thousands of generated strings.

The gateway tokenizes the prompt and the engine never sees text, so the two must agree id for id.
llama.cpp's side is its `/tokenize` (the engine's in-process llama.cpp server, named in
GetServerInfo): every string goes in one request, as the pieces of a mixed prompt separated by a
token id none of them can produce, and comes back split on it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from smg.engines.llamacpp.gguf import read_metadata
from smg.engines.llamacpp.tokenizer import _TOKENIZER_KEYS, _convert
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from tests.llamacpp.conftest import Engine

SEPARATOR = 3  # <repo_name>: a control token no generated string spells
COUNT = 3200
_PIECES = {
    "word": ["the", "The", "hello", "world", "tokenizer", "Paris", "naïve", "café", "über", "straße"],
    "digits": ["0", "7", "42", "123", "2024", "3.14159", "1,000,000", "000", "9876543210", "-5", "1e-9"],
    "space": [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\t\t ", "    \n  "],
    "punct": [".", ",", "!", "?", "...", "--", "()", "{}", "[]", '"', "'", "`", "<", ">", "/", "\\", "@#$%", ":)"],
    "contraction": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "don't", "I'M", "we'RE"],
    "unicode": ["Привет", "γειά", "日本語", "中文", "한국어", "مرحبا", "שלום", "हिन्दी", "ñ", "e\u0301"],
    "emoji": ["🙂", "👍🏽", "🇫🇷", "👩‍💻", "✨", "🚀🚀"],
    "code": ["def f(x):", "return x+1", "if (a && b) {", "x = [1, 2, 3]", "</div>", "SELECT * FROM t;", "a_b-c.d"],
    "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\n", "<|im_end|>\n"],
}


def generated_strings(count: int, seed: int = 14) -> list[str]:
    rng = random.Random(seed)
    kinds = list(_PIECES)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.choice(kinds)
            piece = rng.choice(_PIECES[kind])
            if kind == "digits" and rng.random() < 0.3:
                piece = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 14)))
            parts.append(piece)
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "", "\n", "  "]))
        out.append("".join(parts))
    return out


def llamacpp_tokens(url: str, texts: list[str]) -> list[list[int]]:
    content: list[str | int] = []
    for text in texts:
        content += [text, SEPARATOR]
    response = httpx.post(
        f"{url}/tokenize", json={"content": content, "add_special": False, "parse_special": True}, timeout=60
    )
    response.raise_for_status()
    groups: list[list[int]] = [[]]
    for token in response.json()["tokens"]:
        if token == SEPARATOR:
            groups.append([])
        else:
            groups[-1].append(token)
    assert groups[-1] == [] and len(groups) == len(texts) + 1
    return groups[:-1]


@pytest.fixture(scope="module")
def reference(engine: Engine) -> tuple[list[str], list[list[int]]]:
    texts = generated_strings(COUNT)
    return texts, llamacpp_tokens(engine.server_args()["llamacpp_url"], texts)


def test_the_exported_tokenizer_agrees_with_llamacpp(
    model_files: tuple[Path, Path], reference: tuple[list[str], list[list[int]]]
) -> None:
    texts, expected = reference
    tokenizer = Tokenizer.load(model_files[1])  # as the gateway loads `--model-path`
    differing = [(text, ids) for text, ids in zip(texts, expected) if tokenizer.encode(text) != ids]
    assert not differing, f"{len(differing)} of {len(texts)} strings differ, e.g. {differing[:3]}"


def test_without_llamacpp_s_split_the_conversion_disagrees(
    model_files: tuple[Path, Path], reference: tuple[list[str], list[list[int]]]
) -> None:
    """transformers' conversion alone splits digits as GPT-2 does: the agreement above is the
    pre-tokenizer fix's doing, and the comparison would see its absence."""
    metadata = read_metadata(model_files[0])
    raw = _convert("llama", {name: metadata[key] for key, name in _TOKENIZER_KEYS.items() if key in metadata})
    texts, expected = reference
    differing = sum(raw.encode(text, add_special_tokens=False).ids != ids for text, ids in zip(texts, expected))
    assert differing > COUNT // 20, differing


def test_the_directory_loads_as_a_fast_tokenizer_on_any_transformers(model_files: tuple[Path, Path]) -> None:
    directory = model_files[1]
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["add_bos_token"] is False and config["model_max_length"] == 8192
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation["eos_token_id"][0] == 2  # <|im_end|>
    hf = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    assert hf.convert_ids_to_tokens(2) == "<|im_end|>" and len(hf) == 49152


def test_the_shipped_template_renders_tool_use_and_keeps_the_default_system_prompt(
    model_files: tuple[Path, Path],
) -> None:
    tokenizer = Tokenizer.load(model_files[1])
    hf = tokenizer._hf
    plain = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    own = read_metadata(model_files[0])["tokenizer.chat_template"]
    from jinja2 import Environment

    assert plain == Environment().from_string(own).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "Sunny"},
    ]
    rendered = hf.apply_chat_template(conversation, tools=[tool], tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in rendered
    assert "<tool_response>\nSunny\n</tool_response>" in rendered and '"name": "get_weather"' in rendered
