"""The encode caches (`smg.pipeline.tokenizers.cache`): cached or not, a prompt has the same ids
(on every fixture tokenizer, over a conversation that grows turn by turn, with tools); L1 serves
the next turn from the previous one's prefix, L0 a text seen again; a special token whose split
would change the ids is not a boundary; the memory bound holds; and a gateway launched with the
reference's flags counts what one without them counts."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tokenizers import AddedToken

from smg.pipeline.render import render_prompt
from smg.pipeline.tokenizers.cache import MIN_CHARS, safe_boundaries
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.protocol.parse import parse_create_message
from tools.bench.tokenizer_cache import conversation
from tools.spawn import spawn_engine, spawn_gateway

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOOLS = [
    {
        "name": f"tool_{i}",
        "description": "Reads and writes files under the project. " * 4,
        "input_schema": {
            "type": "object",
            "properties": {f"arg{j}": {"type": "string", "description": f"argument {j} ✓"} for j in range(4)},
            "required": ["arg0"],
        },
    }
    for i in range(8)
]


# Odd whitespace, accents and other scripts in every turn.
WORDS = ("alpha", "béta", "γάμμα", "\n", "  ", "x", "\t", "日本語", "!!")


@pytest.mark.parametrize("fixture", ["qwen3", "llama3", "mistral", "deepseek"])
def test_cached_ids_are_the_tokenizers_own_turn_after_turn(fixture: str) -> None:
    plain = Tokenizer.load(FIXTURES / fixture)
    cached = Tokenizer.load(FIXTURES / fixture)
    cache = cached.enable_cache(1000, 8 << 20)
    assert cache is not None
    for messages in conversation(8, len(fixture), WORDS):
        body = {"model": "m", "max_tokens": 16, "system": "Be brief.\n" * 40, "messages": messages, "tools": TOOLS}
        request = parse_create_message(body)
        assert render_prompt(cached, request).ids == render_prompt(plain, request).ids
        assert render_prompt(cached, request).ids == render_prompt(plain, request).ids  # from L0 now
    assert cache.hits_l0 >= 8
    if fixture in ("qwen3", "llama3", "deepseek"):  # their next turn keeps the previous prompt's start
        assert cache.hits_l1 >= 6


def test_l1_serves_a_prompt_that_starts_with_a_kept_prefix() -> None:
    tokenizer = Tokenizer.load(FIXTURES / "qwen3")
    cache = tokenizer.enable_cache(None, 8 << 20)
    assert cache is not None
    head = "<|im_start|>system\n" + "A long shared system prompt. " * 40 + "<|im_end|>\n<|im_start|>user\n"
    first = head + "first question<|im_end|>\n<|im_start|>assistant\n"
    second = head + "another question, longer, with ünïcode<|im_end|>\n<|im_start|>assistant\n"
    plain = Tokenizer.load(FIXTURES / "qwen3")
    assert tokenizer.encode(first) == plain.encode(first)
    assert (cache.hits_l1, cache.misses) == (0, 1)
    assert tokenizer.encode(second) == plain.encode(second)
    assert cache.hits_l1 == 1  # the shared head came from the first prompt's ids
    short = "x" * (MIN_CHARS - 1)
    assert tokenizer.encode(short) == plain.encode(short) and (cache.hits_l1, cache.misses) == (1, 1)


def test_a_special_token_that_strips_its_neighbours_is_not_a_boundary() -> None:
    tokenizer = Tokenizer.load(FIXTURES / "qwen3")
    tokenizer._hf.add_special_tokens(
        {"additional_special_tokens": [AddedToken("<|strip|>", rstrip=True, lstrip=True, special=True)]}
    )
    strip_id = tokenizer._hf.convert_tokens_to_ids("<|strip|>")
    assert tokenizer._encode("a <|strip|>  b") == tokenizer._encode("a") + [strip_id] + tokenizer._encode("b")
    boundaries = safe_boundaries(tokenizer._encode, [("<|strip|>", strip_id), ("<|im_end|>", 4002)])
    assert boundaries == {"<|im_end|>": 4002}
    cache = tokenizer.enable_cache(None, 8 << 20)
    assert cache is not None and "<|strip|>" not in cache._boundaries
    text = "words " * 60 + "<|strip|>\n\n  after the token " * 3 + "<|im_end|>"
    for _ in range(3):
        assert tokenizer.encode(text) == tokenizer._encode(text)


def test_l1_keeps_to_its_memory_bound() -> None:
    tokenizer = Tokenizer.load(FIXTURES / "qwen3")
    cache = tokenizer.enable_cache(None, 64 << 10)
    assert cache is not None
    for n in range(40):
        text = f"<|im_start|>user\n{n} " + "some words here " * 200 + "<|im_end|>\n<|im_start|>assistant\n"
        assert tokenizer.encode(text) == tokenizer._encode(text)
        assert 0 < cache.l1_bytes <= 64 << 10


def test_both_caches_off_is_no_cache() -> None:
    tokenizer = Tokenizer.load(FIXTURES / "qwen3")
    assert tokenizer.enable_cache(None, None) is None and tokenizer.encode_cache is None
    assert tokenizer.enable_cache(0, 0) is None


def test_a_gateway_with_the_caches_counts_what_one_without_them_counts() -> None:
    engine = spawn_engine("sglang", FIXTURES / "qwen3", ["--served-model-name", "qwen3"])
    flags = ["--tokenizer-cache-enable-l0", "--tokenizer-cache-l0-max-entries", "100"]
    flags += ["--tokenizer-cache-enable-l1", "--tokenizer-cache-l1-max-memory", "1048576"]
    try:
        with (
            spawn_gateway([engine.url], extra=["--model-path", str(FIXTURES / "qwen3"), *flags]) as cached,
            spawn_gateway([engine.url], extra=["--model-path", str(FIXTURES / "qwen3")]) as plain,
        ):
            for messages in conversation(4, 7, WORDS):
                body = {"model": "qwen3", "system": "Be brief.\n" * 40, "messages": messages, "tools": TOOLS}
                counts = [
                    httpx.post(f"{gateway.url}/v1/messages/count_tokens", json=body, timeout=30).json()
                    for gateway in (cached, cached, plain)
                ]
                assert counts[0] == counts[1] == counts[2] and counts[0]["input_tokens"] > 500
    finally:
        engine.stop()
