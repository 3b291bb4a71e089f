"""Tool parser names, auto-detection from the model id (behaviors.md §F.7) and the readers of
JSON-schema-constrained output (§F.3)."""

from __future__ import annotations

import pytest

from smg.pipeline.generation import Text, ToolArgs, ToolCall
from smg.pipeline.parsers.tools import (
    MODEL_PATTERNS,
    TOOL_PARSERS,
    detect_tool_parser,
    has_tool_parser,
    make_tool_parser,
    parse_forced_any,
    parse_forced_tool,
)
from smg.pipeline.parsers.tools.passthrough import PassthroughParser

NAMES = {
    "json",
    "qwen",
    "qwen_xml",
    "qwen_coder",
    "nemotron",
    "llama",
    "pythonic",
    "mistral",
    "deepseek",
    "deepseek31",
    "deepseek32",
    "deepseek_v4",
    "glm45_moe",
    "glm47_moe",
    "kimik2",
    "kimi_k3",
    "minimax_m2",
    "sarashina",
    "step3",
    "inkling",
    "cohere",
    "passthrough",
}


def test_registry_names() -> None:
    assert set(TOOL_PARSERS) == NAMES
    assert TOOL_PARSERS["qwen_coder"] is TOOL_PARSERS["qwen_xml"] is TOOL_PARSERS["nemotron"]
    # Every name the table can yield has a parser.
    assert {parser for _, parser in MODEL_PATTERNS} <= NAMES


@pytest.mark.parametrize(
    ("model", "parser"),
    [
        # The notes of §F.7.
        ("meta-llama/Llama-3.1-8B-Instruct", "json"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen"),
        ("Qwen/Qwen3-Coder-30B", "qwen_xml"),
        ("deepseek-ai/DeepSeek-V3.1", "deepseek31"),
        ("mistralai/Mistral-7B", "mistral"),
        ("some-org/unknown-model", "passthrough"),
        # One per row of the table.
        ("gpt-4o-mini", "json"),
        ("gpt-3.5-turbo", "json"),
        ("claude-3-haiku", "json"),
        ("gemini-1.5-pro", "json"),
        ("palm-2", "json"),
        ("google/gemma-2-9b-it", "json"),
        ("THUDM/glm-4-9b-chat", "json"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistral"),
        ("Qwen/Qwen3.5-35B-A3B", "qwen_xml"),
        ("qwen3.6-plus", "qwen_xml"),
        ("Qwen3.8-Max", "qwen_xml"),
        ("Qwen/Qwen3-8B", "qwen"),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", "qwen_xml"),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "pythonic"),
        ("meta-llama/Llama-3.2-3B-Instruct", "llama"),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseek"),
        ("deepseek-v3", "deepseek"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek31"),
        ("deepseek-ai/DeepSeek-V3.2", "deepseek32"),
        ("deepseek-ai/DeepSeek-V4-Flash", "deepseek_v4"),
        ("deepseek-ai/DeepSeek-R1", "pythonic"),
        ("zai-org/GLM-4.5-Air", "glm45_moe"),
        ("zai-org/GLM-4.6", "glm45_moe"),
        ("zai-org/GLM-4.7", "glm47_moe"),
        ("zai-org/GLM-5", "glm47_moe"),
        ("sbintuitions/sarashina2.2-3b", "sarashina"),
        ("stepfun-ai/step3", "step3"),
        ("stepfun-ai/Step-3.5", "step3"),
        ("moonshotai/Kimi-K2-Instruct", "kimik2"),
        ("moonshotai/Kimi-K3", "kimi_k3"),
        ("moonshotai/kimi_k3-preview", "kimi_k3"),
        ("org/Inkling-Chat", "inkling"),
        ("MiniMaxAI/MiniMax-M2", "minimax_m2"),
        ("CohereForAI/c4ai-command-r-plus", "cohere"),
        ("command-a-03-2025", "cohere"),
        # The families with their own parsers, by every spelling of their rows.
        ("deepseek-v3.2", "deepseek32"),
        ("deepseek-ai/DeepSeek-V3.2-Speciale", "deepseek32"),
        ("deepseek-v4-pro", "deepseek_v4"),
        ("Kimi-K3-Instruct", "kimi_k3"),
        ("Kimi_K3", "kimi_k3"),
        ("CohereLabs/c4ai-command-r7b-12-2024", "cohere"),
        ("CohereForAI/c4ai-command-a-03-2025", "cohere"),
        ("cohere-command-x", "cohere"),
    ],
)
def test_detection(model: str, parser: str) -> None:
    assert detect_tool_parser(model) == parser


def test_detection_is_case_insensitive_and_longest_stem_wins() -> None:
    assert detect_tool_parser("QWEN/QWEN3-CODER-480B") == "qwen_xml"  # beats `qwen*`
    assert detect_tool_parser("my-llama-3.2-finetune") == "llama"  # beats `llama-*`
    assert detect_tool_parser("DeepSeek-V3.1-Terminus") == "deepseek31"  # beats `deepseek-v3*`
    assert detect_tool_parser("") == "passthrough"


def test_an_exact_key_matches_first() -> None:
    assert detect_tool_parser("qwen*") == "qwen"


def test_unknown_names_fall_back_to_passthrough() -> None:
    for name in ["no-such-parser", ""]:
        parser = make_tool_parser(name, [])
        assert isinstance(parser, PassthroughParser)
        assert not has_tool_parser(name)
        pieces = [Text("<tool_call>{}</tool_call>")]
        assert parser.feed(pieces) == pieces
        assert parser.flush() == []
    assert has_tool_parser("qwen") and not has_tool_parser("passthrough")


def test_make_tool_parser_gives_fresh_stages() -> None:
    a, b = make_tool_parser("qwen"), make_tool_parser("qwen")
    assert a is not b
    out = a.feed([Text('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')]) + a.flush()
    assert [type(p) for p in out] == [ToolCall, ToolArgs]
    assert b.feed([Text("plain")]) + b.flush() == [Text("plain")]


# --- JSON-schema-constrained output (§F.3) -------------------------------------------------------


def test_forced_any() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "noop", "parameters": {}}]'
    assert parse_forced_any(text) == [("get_weather", {"city": "Paris"}), ("noop", {})]
    assert parse_forced_any('[{"name": "f", "arguments": {"a": 1}}]') == [("f", {"a": 1})]
    assert parse_forced_any('[{"name": "f", "parameters": "{\\"a\\": 1}"}]') == [("f", {"a": 1})]
    assert parse_forced_any('[{"name": "f"}]') == [("f", {})]
    assert parse_forced_any("[]") == []


@pytest.mark.parametrize(
    "text",
    ['{"name": "f", "parameters": {}}', '[{"name": "f", "parameters": {}', '[{"parameters": {}}]', "[1]", "", "nope"],
)
def test_forced_any_unparseable_is_none(text: str) -> None:
    assert parse_forced_any(text) is None


def test_forced_tool() -> None:
    assert parse_forced_tool('{"city": "Paris", "n": [1]}') == {"city": "Paris", "n": [1]}
    assert parse_forced_tool(' {"a": {}}\n') == {"a": {}}
    for text in ['{"city": "Par', "[1]", '"s"', "", "null"]:
        assert parse_forced_tool(text) is None
