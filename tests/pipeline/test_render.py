"""Anthropic request → chat-template inputs → prompt (behaviors.md §F.2, §E.3)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from smg.pipeline.render import Prompt, convert_messages, convert_tools, render_prompt
from smg.pipeline.tokenizers import Tokenizer
from smg.protocol.errors import ApiError
from smg.protocol.request import CountTokensRequest, CreateMessageRequest
from tests.pipeline import _toy

WEATHER = {
    "name": "get_weather",
    "description": "Get the weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {}, "$defs": {"x": {"type": "string"}}}}


def create(**body: Any) -> CreateMessageRequest:
    body.setdefault("model", "m")
    body.setdefault("max_tokens", 16)
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return CreateMessageRequest.model_validate(body)


def count(**body: Any) -> CountTokensRequest:
    body.setdefault("model", "m")
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return CountTokensRequest.model_validate(body)


# --- messages ----------------------------------------------------------------------------------


def test_system_prompt_is_prepended_and_mid_conversation_system_kept_in_place() -> None:
    req = create(
        system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        messages=[
            {"role": "system", "content": "early"},
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
            {"role": "user", "content": "Again"},
        ],
    )
    assert convert_messages(req) == [
        {"role": "system", "content": "A\nB"},
        {"role": "system", "content": "early"},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "x\ny"},
        {"role": "user", "content": "Again"},
    ]


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}


def user_blocks() -> CreateMessageRequest:
    return create(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    IMAGE,
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "DOC"}},
                    {
                        "type": "document",
                        "source": {"type": "content", "content": [{"type": "text", "text": "C1"}, IMAGE]},
                    },
                ],
            }
        ]
    )


def test_user_blocks_as_parts_with_media_first() -> None:
    assert convert_messages(user_blocks(), "openai") == [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "Look:"},
                {"type": "text", "text": "DOC"},
                {"type": "text", "text": "C1"},
            ],
        }
    ]
    authored = convert_messages(user_blocks(), "openai", media_first=False)
    assert [p["type"] for p in authored[0]["content"]] == ["text", "image", "text", "text"]


def test_string_templates_get_parts_joined_with_images_dropped_or_placeholders() -> None:
    assert convert_messages(user_blocks(), "string") == [{"role": "user", "content": "Look:\nDOC\nC1"}]
    placeholder = convert_messages(user_blocks(), "string", image_placeholder="<img>")
    assert placeholder == [{"role": "user", "content": "<img>\nLook:\nDOC\nC1"}]


@pytest.mark.parametrize(
    "source",
    [
        {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
        {"type": "url", "url": "https://example.com/a.pdf"},
        {"type": "content", "content": [IMAGE]},
    ],
)
def test_a_document_with_no_text_is_refused_naming_its_path(source: dict[str, Any]) -> None:
    req = create(
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yes?"},
            {"role": "user", "content": [{"type": "document", "source": source}, {"type": "text", "text": "?"}]},
        ]
    )
    with pytest.raises(ApiError) as info:
        convert_messages(req, "openai")
    assert info.value.status == 400
    assert info.value.code == "process_messages_failed"
    assert info.value.message.startswith("messages.2.content.0: ")
    tok = _toy.fixture("qwen3")
    with pytest.raises(ApiError) as counted:
        render_prompt(tok, count(messages=req.model_dump(exclude_unset=True)["messages"]))
    assert (counted.value.status, counted.value.code) == (400, "process_messages_failed")


def test_tool_results_become_tool_messages_where_they_stand() -> None:
    """Unlike the reference (one user message first, then every tool message), the blocks keep
    their order: the model sees its tool's answer right after its call."""
    req = create(
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "plan", "signature": "s"},
                    {"type": "thinking", "thinking": "more", "signature": "s"},
                    {"type": "text", "text": "Let me "},
                    {"type": "text", "text": "check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny", "is_error": True},
                    {"type": "text", "text": "Thanks"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "12"}, IMAGE, {"type": "text", "text": "00"}],
                    },
                ],
            },
        ],
        tools=[WEATHER, TIME],
    )
    assert convert_messages(req, "string") == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "plan\nmore",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {"id": "toolu_2", "type": "function", "function": {"name": "get_time", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "user", "content": "Thanks"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "12\n00"},
    ]


def test_tool_only_turns() -> None:
    req = create(
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
        tools=[WEATHER],
    )
    converted = convert_messages(req)
    assert converted[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": {}}}],
    }
    assert converted[2:] == [{"role": "tool", "tool_call_id": "t1", "content": ""}]


# --- tools -------------------------------------------------------------------------------------


def test_only_custom_tools_are_rendered_keeping_schema_order() -> None:
    tools = create(
        tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search"}, TIME],
    ).tools
    converted = convert_tools(tools, None)
    assert converted == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather",
                "parameters": WEATHER["input_schema"],
            },
        },
        {"type": "function", "function": {"name": "get_time", "parameters": TIME["input_schema"]}},
    ]
    assert converted is not None
    assert list(converted[0]["function"]["parameters"]["properties"]) == ["city", "unit"]


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        (None, ["get_weather", "get_time"]),
        ({"type": "auto"}, ["get_weather", "get_time"]),
        ({"type": "any"}, ["get_weather", "get_time"]),
        ({"type": "tool", "name": "get_time"}, ["get_time"]),
        ({"type": "none"}, None),
    ],
)
def test_tools_are_filtered_by_tool_choice(choice: dict[str, Any] | None, names: list[str] | None) -> None:
    req = create(tools=[WEATHER, TIME], tool_choice=choice)
    converted = convert_tools(req.tools, req.tool_choice)
    assert (None if converted is None else [t["function"]["name"] for t in converted]) == names


def test_no_custom_tools_is_none() -> None:
    assert convert_tools(None, None) is None
    assert convert_tools(create(tools=[{"type": "web_search_20250305", "name": "web_search"}]).tools, None) is None


# --- prompts -----------------------------------------------------------------------------------


def test_simple_prompt_on_qwen3() -> None:
    tok = _toy.fixture("qwen3")
    prompt = render_prompt(tok, create(system="Be brief.", messages=[{"role": "user", "content": "Hi"}]))
    assert (
        prompt.text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt.ids == tok.encode(prompt.text)
    assert prompt.digest == hashlib.sha256(prompt.text.encode()).hexdigest()
    assert prompt.thinking is True  # Qwen3 thinks unless told not to
    assert prompt.tools is None


@pytest.mark.parametrize(
    ("thinking", "effective", "suffix"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, True, "<|im_start|>assistant\n"),
        ({"type": "adaptive"}, True, "<|im_start|>assistant\n"),
        ({"type": "disabled"}, False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ],
)
def test_thinking_goes_to_the_templates_toggle(thinking: dict[str, Any], effective: bool, suffix: str) -> None:
    prompt = render_prompt(_toy.fixture("qwen3"), create(max_tokens=4096, thinking=thinking))
    assert prompt.thinking is effective
    assert prompt.text.endswith("<|im_end|>\n" + suffix)


def test_bare_thinking_toggle_deepseek() -> None:
    tok = _toy.fixture("deepseek")
    assert render_prompt(tok, create()).text.endswith("<｜Assistant｜></think>")
    assert render_prompt(tok, create()).thinking is False
    enabled = render_prompt(tok, create(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 2048}))
    assert enabled.text.endswith("<｜Assistant｜><think>")
    assert enabled.thinking is True


def test_templates_without_a_toggle_report_the_request() -> None:
    tok = _toy.fixture("llama3")
    assert render_prompt(tok, create()).thinking is None
    disabled = render_prompt(tok, create(thinking={"type": "disabled"}))
    assert disabled.thinking is False
    assert disabled.text == render_prompt(tok, create()).text


def test_tool_choice_none_renders_no_tools() -> None:
    tok = _toy.fixture("qwen3")
    with_tools = render_prompt(tok, create(tools=[WEATHER]))
    assert "get_weather" in with_tools.text
    assert with_tools.tools == convert_tools(create(tools=[WEATHER]).tools, None)
    none = render_prompt(tok, create(tools=[WEATHER], tool_choice={"type": "none"}))
    assert "get_weather" not in none.text
    assert none.tools is None
    assert none.text == render_prompt(tok, create()).text


def test_a_final_assistant_message_is_continued() -> None:
    tok = _toy.fixture("llama3")
    prompt = render_prompt(
        tok, create(messages=[{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}])
    )
    assert prompt.text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n1, 2,")
    blocks = create(
        messages=[
            {"role": "user", "content": "Count"},
            {"role": "assistant", "content": [{"type": "text", "text": "1, "}, {"type": "text", "text": "2,"}]},
        ]
    )
    assert render_prompt(tok, blocks).text == prompt.text


@pytest.mark.parametrize("name", _toy.FIXTURE_NAMES)
def test_prefill_on_every_fixture_ends_with_the_prefill(name: str) -> None:
    tok = _toy.fixture(name)
    prompt = render_prompt(
        tok, create(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}])
    )
    assert prompt.text.endswith("Well,")


@pytest.mark.parametrize("name", _toy.FIXTURE_NAMES)
def test_a_full_tool_conversation_renders_on_every_fixture(name: str) -> None:
    tok = _toy.fixture(name)
    req = create(
        system="Sys",
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}, IMAGE]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]},
        ],
    )
    prompt = render_prompt(tok, req)
    assert "Sunny" in prompt.text
    assert '"city": "Paris"' in prompt.text
    assert "get_weather" in prompt.text
    assert len(prompt.ids) > 10


def test_count_tokens_renders_exactly_like_create() -> None:
    tok = _toy.fixture("qwen3")
    body: dict[str, Any] = {
        "system": "S",
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "tool", "name": "get_time"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, IMAGE]}],
    }
    created: Prompt = render_prompt(tok, create(**body))
    counted: Prompt = render_prompt(tok, count(**body, metadata={"ignored": True}))
    assert created == counted
    assert "get_weather" not in counted.text and "get_time" in counted.text
    assert "<|image_pad|>" in counted.text


def test_string_format_templates_get_the_callers_image_placeholder() -> None:
    tok = _toy.byte_level()
    req = create(messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]}])
    assert "<|im_start|>user\nsee<|im_end|>" in render_prompt(tok, req).text
    assert "<|im_start|>user\n<IMG>\nsee<|im_end|>" in render_prompt(tok, req, image_placeholder="<IMG>").text


def test_template_failure_is_a_400() -> None:
    tok = _toy.byte_level("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ApiError) as info:
        render_prompt(tok, create())
    assert info.value.status == 400
    assert info.value.code == "process_messages_failed"
    assert info.value.message == "Failed to apply chat template: roles must alternate"


def test_encoding_failure_is_a_500(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = _toy.byte_level()

    def broken(self: Tokenizer, text: str) -> list[int]:
        raise RuntimeError("boom")

    monkeypatch.setattr(Tokenizer, "encode", broken)
    with pytest.raises(ApiError) as info:
        render_prompt(tok, create())
    assert (info.value.status, info.value.code, info.value.message) == (
        500,
        "tokenization_failed",
        "Tokenization failed: boom",
    )
