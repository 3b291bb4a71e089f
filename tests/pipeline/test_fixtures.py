"""The fixture tokenizers under tests/fixtures load offline, keep their families' tokens and templates, and rebuild
byte for byte from `tools.build_fixtures`."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tools.build_fixtures import FAMILIES, FIXTURES_DIR, build

NAMES = ("qwen3", "llama3", "deepseek", "mistral")

# Every family's control tokens, and which of them are NOT "special" (they survive skip_special_tokens=True).
SPECIALS: dict[str, list[str]] = {
    "qwen3": [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
    ],
    "llama3": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ],
    "deepseek": [
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<think>",
        "</think>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁outputs▁begin｜>",
        "<｜tool▁outputs▁end｜>",
        "<｜tool▁output▁begin｜>",
        "<｜tool▁output▁end｜>",
    ],
    "mistral": [
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[IMG]",
    ],
}
NOT_SPECIAL: dict[str, set[str]] = {
    "qwen3": {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"},
    "llama3": set(),
    "deepseek": {"<think>", "</think>"} | {t for t in SPECIALS["deepseek"] if "tool" in t},
    "mistral": set(),
}
EOS: dict[str, tuple[str, list[str]]] = {  # tokenizer eos_token, generation_config eos_token_id (as tokens)
    "qwen3": ("<|im_end|>", ["<|im_end|>", "<|endoftext|>"]),
    "llama3": ("<|eot_id|>", ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"]),
    "deepseek": ("<｜end▁of▁sentence｜>", ["<｜end▁of▁sentence｜>"]),
    "mistral": ("</s>", ["</s>"]),
}
BOS: dict[str, str | None] = {
    "qwen3": None,
    "llama3": "<|begin_of_text|>",
    "deepseek": "<｜begin▁of▁sentence｜>",
    "mistral": "<s>",
}
MODEL_TYPES = {"qwen3": "qwen3", "llama3": "llama", "deepseek": "deepseek_v3", "mistral": "mistral"}

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Café, naïve résumé, crème brûlée, Straße, Łódź, Ελλάδα, привет.",
    "今天天气很好。東京タワーに行きましょう。안녕하세요 鬱龍",
    "Emoji: 😀🎉👍🏽 🇫🇷 👩\u200d💻 🦀 ❤️",
    '{"name": "get_weather", "arguments": {"city": "São Paulo"}}',
    "  leading and trailing spaces  \n\n\ttabs\r\n",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should call the weather tool.",
        "tool_calls": [
            {
                "id": "call_abc123",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_abc123", "content": "Sunny, 21 degrees"},
    {"role": "assistant", "content": "It is sunny and 21 degrees in Paris."},
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": [{"type": "text", "text": "And what is in this picture?"}, {"type": "image"}]},
]

# What each family's rendering of CONVERSATION (with TOOLS, add_generation_prompt=True) must contain, and end with.
MARKERS: dict[str, list[str]] = {
    "qwen3": [
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n",
        '<tools>\n{"type": "function", "function": {"name": "get_weather"',
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<|im_start|>user\n<tool_response>\nSunny, 21 degrees\n</tool_response><|im_end|>",
        "<|im_start|>system\nAnswer in one short sentence.<|im_end|>",
        "And what is in this picture?<|vision_start|><|image_pad|><|vision_end|><|im_end|>",
    ],
    "llama3": [
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n",
        "You are a helpful assistant.<|eot_id|>",
        '"name": "get_weather"',
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "<|start_header_id|>ipython<|end_header_id|>\n\nSunny, 21 degrees<|eot_id|>",
        "<|start_header_id|>system<|end_header_id|>\n\nAnswer in one short sentence.<|eot_id|>",
        "And what is in this picture?<image><|eot_id|>",
    ],
    "deepseek": [
        "<｜begin▁of▁sentence｜>You are a helpful assistant.\n\n## Tools\n",
        "### get_weather\nDescription: Get the current weather for a city.",
        "<｜User｜>What is the weather in Paris?<｜Assistant｜></think>",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        "<｜tool▁output▁begin｜>Sunny, 21 degrees<｜tool▁output▁end｜>",
        "It is sunny and 21 degrees in Paris.<｜end▁of▁sentence｜>Answer in one short sentence.",
        "<｜User｜>And what is in this picture?<image>",
    ],
    "mistral": [
        "<s>[SYSTEM_PROMPT]You are a helpful assistant.[/SYSTEM_PROMPT]",
        "[INST]What is the weather in Paris?[/INST]",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_abc123"}]</s>',
        '[TOOL_RESULTS]{"content": "Sunny, 21 degrees", "call_id": "call_abc123"}[/TOOL_RESULTS]',
        "It is sunny and 21 degrees in Paris.</s>[SYSTEM_PROMPT]Answer in one short sentence.[/SYSTEM_PROMPT]",
        '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"',
        "[/AVAILABLE_TOOLS][INST]And what is in this picture?[IMG][/INST]",
    ],
}
ENDS_WITH = {
    "qwen3": "<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "deepseek": "<image><｜Assistant｜></think>",
    "mistral": "[IMG][/INST]",
}


@cache
def load(name: str) -> Any:
    return AutoTokenizer.from_pretrained(str(FIXTURES_DIR / name))


def read_json(name: str, file: str) -> Any:
    return json.loads((FIXTURES_DIR / name / file).read_text(encoding="utf-8"))


def render(name: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text = load(name).apply_chat_template(messages, tokenize=False, **kwargs)
    assert isinstance(text, str)
    return text


def test_every_family_is_built() -> None:
    assert sorted(FAMILIES) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_loads_offline_as_a_fast_tokenizer(name: str) -> None:
    files = {p.name for p in (FIXTURES_DIR / name).iterdir()}
    expected = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"}
    assert expected | {"config.json"} <= files
    assert sum((FIXTURES_DIR / name / f).stat().st_size for f in files) < 400_000
    tok = load(name)
    assert tok.is_fast
    assert 3000 <= len(tok) <= 4100
    assert read_json(name, "tokenizer_config.json")["tokenizer_class"] == "PreTrainedTokenizerFast"


@pytest.mark.parametrize("name", NAMES)
def test_each_special_token_is_one_id(name: str) -> None:
    tok = load(name)
    ids = set()
    for token in SPECIALS[name]:
        encoded = tok.encode(token, add_special_tokens=False)
        assert len(encoded) == 1, (token, encoded)
        assert tok.convert_ids_to_tokens(encoded[0]) == token
        ids.add(encoded[0])
        # Inside text too: an added token is never split by the surrounding bytes.
        assert encoded[0] in tok.encode(f"abc{token}def", add_special_tokens=False)
    assert len(ids) == len(SPECIALS[name])


@pytest.mark.parametrize("name", NAMES)
def test_special_flags_match_the_family(name: str) -> None:
    tok = load(name)
    for token in SPECIALS[name]:
        ids = tok.encode(f"x{token}y", add_special_tokens=False)
        kept = tok.decode(ids, skip_special_tokens=True)
        if token in NOT_SPECIAL[name]:
            assert kept == f"x{token}y", token
        else:
            assert kept == "xy", token
        assert tok.decode(ids) == f"x{token}y"


@pytest.mark.parametrize("name", NAMES)
def test_eos_bos_and_configs(name: str) -> None:
    tok = load(name)
    eos, stops = EOS[name]
    stop_ids = [tok.convert_tokens_to_ids(t) for t in stops]
    assert tok.eos_token == eos
    assert tok.eos_token_id == stop_ids[0]
    assert tok.bos_token == BOS[name]
    assert tok.pad_token_id is not None
    generation = read_json(name, "generation_config.json")
    assert generation["eos_token_id"] == stop_ids
    config = read_json(name, "config.json")
    assert config["model_type"] == MODEL_TYPES[name]
    assert config["architectures"] and config["max_position_embeddings"] > 0
    assert config["eos_token_id"] in (stop_ids, stop_ids[0])
    assert config["bos_token_id"] == generation["bos_token_id"]
    assert config["vocab_size"] == len(tok)
    text = "Hello there"
    if BOS[name] is None:
        assert tok.encode(text) == tok.encode(text, add_special_tokens=False)
    else:
        assert tok.encode(text) == [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", TEXTS)
def test_decode_encode_round_trips(name: str, text: str) -> None:
    tok = load(name)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


@pytest.mark.parametrize("name", NAMES)
def test_some_characters_span_several_tokens(name: str) -> None:
    tok = load(name)
    for char in ("鬱", "🦀", "ß"):
        ids = tok.encode(char, add_special_tokens=False)
        assert len(ids) > 1, char
        assert "\ufffd" in tok.decode(ids[:1])  # a partial character: what incremental detokenization holds back


@pytest.mark.parametrize("name", NAMES)
def test_chat_template_file_and_config_agree(name: str) -> None:
    jinja = (FIXTURES_DIR / name / "chat_template.jinja").read_text(encoding="utf-8")
    assert read_json(name, "tokenizer_config.json")["chat_template"] == jinja
    assert load(name).chat_template == jinja


@pytest.mark.parametrize("name", NAMES)
def test_renders_a_full_conversation(name: str) -> None:
    text = render(name, CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    position = -1
    for marker in MARKERS[name]:
        assert marker in text, (marker, text)
    # In place and in order: the mid-conversation system message sits between the turns around it.
    for marker in ("What is the weather in Paris?", "Sunny, 21 degrees", "Answer in one short sentence.", "picture"):
        assert text.index(marker) > position, marker
        position = text.index(marker)
    assert text.endswith(ENDS_WITH[name]), text[-80:]
    # The rendered prompt tokenizes with every marker as one id and the bos only once.
    tok = load(name)
    ids = tok.encode(text, add_special_tokens=False)
    if BOS[name] is not None:
        assert ids[0] == tok.bos_token_id
        assert ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids) == text


@pytest.mark.parametrize("name", NAMES)
def test_renders_string_content_without_tools_or_generation_prompt(name: str) -> None:
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]
    text = render(name, messages)
    assert "Hi there" in text and "Hello!" in text
    assert text.endswith(EOS[name][0] + ("\n" if name == "qwen3" else ""))


def test_qwen3_thinking_toggle() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    on = render("qwen3", messages, add_generation_prompt=True)
    assert on.endswith("<|im_start|>assistant\n")
    assert render("qwen3", messages, add_generation_prompt=True, enable_thinking=True) == on
    off = render("qwen3", messages, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    full = render("qwen3", CONVERSATION, tools=TOOLS, add_generation_prompt=True, enable_thinking=False)
    assert full.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_renders_reasoning_for_turns_after_the_last_query() -> None:
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
    ]
    assert render("qwen3", messages).endswith(
        "<|im_start|>assistant\n<think>\nTwo plus two is four.\n</think>\n\n4<|im_end|>\n"
    )
    # The tool-calling turn of CONVERSATION precedes the last real query, so its reasoning is dropped from history.
    full = render("qwen3", CONVERSATION, tools=TOOLS)
    assert "I should call the weather tool." not in full
    # ...but kept while the turn is still in progress (only tool results follow the query).
    partial = render("qwen3", CONVERSATION[:4], tools=TOOLS, add_generation_prompt=True)
    assert "<|im_start|>assistant\n<think>\nI should call the weather tool.\n</think>\n\n<tool_call>" in partial


def test_deepseek_thinking_toggle() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert render("deepseek", messages, add_generation_prompt=True).endswith("<｜User｜>Hi<｜Assistant｜></think>")
    off = render("deepseek", messages, add_generation_prompt=True, thinking=False)
    assert off.endswith("<｜Assistant｜></think>")
    on = render("deepseek", messages, add_generation_prompt=True, thinking=True)
    assert on.endswith("<｜User｜>Hi<｜Assistant｜><think>")
    # After a tool result the model continues its own turn: no new <｜Assistant｜>.
    after_tool = render("deepseek", CONVERSATION[:4], add_generation_prompt=True, thinking=True)
    assert after_tool.endswith("<｜tool▁output▁end｜>")


@pytest.mark.parametrize("name", ["llama3", "mistral"])
def test_no_thinking_toggle(name: str) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    plain = render(name, messages, add_generation_prompt=True)
    for kwargs in ({"enable_thinking": False}, {"thinking": True}):
        assert render(name, messages, add_generation_prompt=True, **kwargs) == plain
    assert "<think>" not in plain


def test_arguments_may_be_a_json_string() -> None:
    call = {"id": "call_abc123", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    assert '{"name": "f", "arguments": {"x": 1}}' in render("qwen3", messages)
    assert '{"name": "f", "parameters": {"x": 1}}' in render("llama3", messages)
    assert '<｜tool▁call▁begin｜>f<｜tool▁sep｜>{"x": 1}<｜tool▁call▁end｜>' in render("deepseek", messages)
    assert '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}, "id": "call_abc123"}]</s>' in render("mistral", messages)


def test_rebuild_is_byte_for_byte_identical(tmp_path: Path) -> None:
    build(tmp_path)
    for name in NAMES:
        committed = sorted(p.name for p in (FIXTURES_DIR / name).iterdir())
        rebuilt = sorted(p.name for p in (tmp_path / name).iterdir())
        assert rebuilt == committed, name
        for file in committed:
            assert (tmp_path / name / file).read_bytes() == (FIXTURES_DIR / name / file).read_bytes(), (name, file)
