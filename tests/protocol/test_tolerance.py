"""What the gateway must accept and keep: current public-API shapes, unknown fields, and the
request a Claude Code client sends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smg.protocol.content import (
    ContentSource,
    DocumentBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from smg.protocol.request import ThinkingAdaptive, ThinkingEnabled
from smg.protocol.tools import CustomTool, McpToolset, ServerTool

from ._bodies import (
    accepted,
    assistant,
    body,
    count_accepted,
    count_refused,
    custom_tool,
    system,
    tool_result,
    tool_use,
    user,
)

EPHEMERAL_1H = {"type": "ephemeral", "ttl": "1h"}

# One block of every accepted type, each carrying `cache_control` and an unmodeled key.
EVERY_BLOCK: dict[str, dict[str, Any]] = {
    "text": {"type": "text", "text": "hi", "citations": [{"type": "char_location", "cited_text": "c"}]},
    "image": {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
    "document": {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
        "title": "t",
        "context": "c",
        "citations": {"enabled": True},
    },
    "tool_use": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}, "caller": {"type": "direct"}},
    "tool_result": {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok", "is_error": False},
    "thinking": {"type": "thinking", "thinking": "hmm", "signature": "sig"},
    "redacted_thinking": {"type": "redacted_thinking", "data": "xyz"},
    "server_tool_use": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "x"}},
    "search_result": {
        "type": "search_result",
        "source": "https://e.x",
        "title": "t",
        "content": [{"type": "text", "text": "r"}],
        "citations": {"enabled": True},
    },
    "web_search_tool_result": {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
    },
    "tool_search_tool_result": {
        "type": "tool_search_tool_result",
        "tool_use_id": "srvtoolu_2",
        "content": {
            "type": "tool_search_tool_search_result",
            "tool_references": [{"type": "tool_reference", "tool_name": "get_weather"}],
        },
    },
    "tool_reference": {"type": "tool_reference", "tool_name": "get_weather", "description": "d"},
}


def _message_for(block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "tool_use":
        return [user("q"), assistant([block]), user([tool_result("toolu_1")])]
    if block["type"] == "tool_result":
        return [user("q"), assistant([tool_use("toolu_1")]), user([block])]
    if block["type"] in ("thinking", "redacted_thinking", "server_tool_use"):
        return [user("q"), assistant([block, {"type": "text", "text": "done"}])]
    return [user([block])]


@pytest.mark.parametrize("kind", sorted(EVERY_BLOCK))
def test_every_block_type_takes_cache_control_and_extra_keys(kind: str) -> None:
    block = {**EVERY_BLOCK[kind], "cache_control": EPHEMERAL_1H, "future_field": [1, 2]}
    req = accepted(body(messages=_message_for(block)))
    dumped = req.model_dump(mode="json", exclude_unset=True)
    assert any(b == block for m in dumped["messages"] if isinstance(m["content"], list) for b in m["content"])


def test_exactly_twelve_block_types() -> None:
    assert len(EVERY_BLOCK) == 12


@pytest.mark.parametrize(
    "source",
    [
        {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
        {"type": "url", "url": "https://e.x/a.pdf"},
        {"type": "text", "data": "plain"},
        {
            "type": "content",
            "content": [{"type": "text", "text": "a"}, {"type": "image", "source": {"type": "url", "url": "u"}}],
        },
        {"type": "content", "content": "just a string"},
        {"type": "file", "file_id": "file_011"},
    ],
)
def test_document_sources(source: dict[str, Any]) -> None:
    accepted(body(messages=[user([{"type": "document", "source": source}])]))


@pytest.mark.parametrize(
    "source",
    [
        {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"},
        {"type": "url", "url": "https://e.x/a.png"},
        {"type": "file", "file_id": "file_011"},
    ],
)
def test_image_sources(source: dict[str, Any]) -> None:
    accepted(body(messages=[user([{"type": "image", "source": source}])]))


def test_document_text_is_readable_from_text_and_content_sources() -> None:
    req = accepted(
        body(
            messages=[
                user(
                    [
                        {"type": "document", "source": {"type": "text", "data": "plain"}},
                        {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "a"}]}},
                        {"type": "document", "source": {"type": "url", "url": "u"}},
                    ]
                )
            ]
        )
    )
    blocks = req.messages[0].content
    assert isinstance(blocks, list)
    docs = [b for b in blocks if isinstance(b, DocumentBlock)]
    assert [d.source_text() for d in docs] == ["plain", "a", None]
    assert isinstance(docs[1].source, ContentSource)


def test_tool_result_content_blocks() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [
            {"type": "text", "text": "r"},
            {"type": "image", "source": {"type": "url", "url": "u"}},
            {"type": "tool_reference", "tool_name": "get_weather"},
        ],
        "is_error": True,
    }
    req = accepted(body(messages=[user("q"), assistant([tool_use("toolu_1")]), user([result])]))
    block = req.messages[2].content[0]  # type: ignore[index]
    assert isinstance(block, ToolResultBlock)
    assert isinstance(block.content, list)


def test_tool_result_without_content() -> None:
    accepted(
        body(
            messages=[
                user("q"),
                assistant([tool_use("toolu_1")]),
                user([{"type": "tool_result", "tool_use_id": "toolu_1"}]),
            ]
        )
    )


def test_current_public_api_tool_fields() -> None:
    tool = {
        "name": "get_weather",
        "description": "Get the weather",
        "input_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "defer_loading": True,
        "strict": True,
        "cache_control": EPHEMERAL_1H,
        "eager_input_streaming": True,
        "input_examples": [{"city": "Paris"}],
        "allowed_callers": ["direct", "code_execution_20250825"],
    }
    req = accepted(body(tools=[tool, {**custom_tool("other"), "type": "custom"}]))
    assert req.tools is not None
    assert isinstance(req.tools[0], CustomTool)
    dumped = req.model_dump(mode="json", exclude_unset=True)
    assert dumped["tools"][0] == tool
    assert dumped["tools"][1]["type"] == "custom"


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 10000},
        {
            "type": "web_search_20250305",
            "name": "web_search",
            "max_uses": 5,
            "allowed_domains": ["e.x"],
            "user_location": {"type": "approximate", "city": "Paris"},
        },
        {"type": "web_fetch_20250910", "name": "web_fetch", "citations": {"enabled": True}},
        {"type": "code_execution_20250825", "name": "code_execution"},
        {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex", "allowed_callers": ["direct"]},
        {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
        {"type": "memory_20250818", "name": "memory", "cache_control": {"type": "ephemeral"}},
        {"type": "some_future_tool_20270101", "name": "future", "anything": {"nested": [1]}},
    ],
)
def test_server_tools_are_kept_whole(tool: dict[str, Any]) -> None:
    req = accepted(body(tools=[tool]))
    assert req.tools is not None and isinstance(req.tools[0], ServerTool)
    assert req.model_dump(mode="json", exclude_unset=True)["tools"] == [tool]


def test_mcp_toolset_round_trip() -> None:
    toolset = {
        "type": "mcp_toolset",
        "mcp_server_name": "search",
        "default_config": {"enabled": False, "defer_loading": True},
        "configs": {"brave_web_search": {"enabled": True}},
        "cache_control": {"type": "ephemeral"},
    }
    servers = [
        {
            "type": "url",
            "name": "search",
            "url": "https://mcp.example.com/mcp",
            "authorization_token": "t",
            "tool_configuration": {"enabled": True, "allowed_tools": ["brave_web_search"]},
        }
    ]
    req = accepted(body(tools=[toolset], mcp_servers=servers))
    assert req.tools is not None and isinstance(req.tools[0], McpToolset)
    assert req.tools[0].enables("brave_web_search") and not req.tools[0].enables("other")
    dumped = req.model_dump(mode="json", exclude_unset=True)
    assert dumped["tools"] == [toolset] and dumped["mcp_servers"] == servers


def test_mcp_server_type_defaults_to_url() -> None:
    req = accepted(body(mcp_servers=[{"name": "s", "url": "https://x"}]))
    assert req.mcp_servers is not None and req.mcp_servers[0].type == "url"


@pytest.mark.parametrize("display", ["summarized", "omitted", "updates", "something_new"])
@pytest.mark.parametrize("thinking", [{"type": "adaptive"}, {"type": "enabled", "budget_tokens": 2048}])
def test_thinking_display_takes_any_string(thinking: dict[str, Any], display: str) -> None:
    req = accepted(body(max_tokens=4096, thinking={**thinking, "display": display}))
    assert req.thinking is not None and req.thinking.display == display  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "thinking",
    [{"type": "adaptive"}, {"type": "enabled", "budget_tokens": 2048}, {"type": "disabled"}],
)
def test_thinking_without_display_serializes_without_display(thinking: dict[str, Any]) -> None:
    req = accepted(body(max_tokens=4096, thinking=thinking))
    assert req.model_dump(mode="json", exclude_unset=True)["thinking"] == thinking
    assert isinstance(req.thinking, ThinkingAdaptive | ThinkingEnabled) or thinking["type"] == "disabled"


def test_thinking_built_in_code_keeps_its_type() -> None:
    assert ThinkingAdaptive().model_dump(exclude_unset=True) == {"type": "adaptive"}


def test_unknown_top_level_fields_preserved() -> None:
    extra = {
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "high"},
        "output_format": None,
        "some_future_field": [1, {"a": None}],
    }
    req = accepted(body(**extra))
    assert req.model_extra == extra
    dumped = req.model_dump(mode="json", exclude_unset=True)
    for key, value in extra.items():
        assert dumped[key] == value


def test_system_blocks_preserve_type_field() -> None:
    system_blocks = [
        {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief."},
    ]
    req = accepted(body(system=system_blocks))
    assert req.model_dump(mode="json", exclude_unset=True)["system"] == system_blocks


def test_message_content_blocks_preserve_type_field() -> None:
    messages = [user([{"type": "text", "text": "a"}, {"type": "image", "source": {"type": "url", "url": "u"}}])]
    req = accepted(body(messages=messages))
    assert req.model_dump(mode="json", exclude_unset=True)["messages"] == messages


def test_blocks_built_in_code_keep_their_type() -> None:
    assert TextBlock(text="a").model_dump(exclude_unset=True) == {"type": "text", "text": "a"}
    assert ToolUseBlock(id="t", name="n", input={}).model_dump(exclude_unset=True)["type"] == "tool_use"


def test_round_trip_is_identity_for_a_rich_body() -> None:
    data = claude_code_body()
    req = accepted(data)
    assert req.model_dump(mode="json", exclude_unset=True, by_alias=True) == data


@pytest.mark.parametrize(
    "user_id",
    [
        "user_abc123_account_00000000-0000-0000-0000-000000000000_session_11111111",
        json.dumps({"device_id": "d", "account_uuid": "a", "session_id": "s"}),
    ],
)
def test_metadata_user_id_is_any_string(user_id: str) -> None:
    req = accepted(body(metadata={"user_id": user_id, "other": 1}))
    assert req.metadata is not None and req.metadata.user_id == user_id
    assert req.metadata.model_extra == {"other": 1}


@pytest.mark.parametrize("container", ["container_011", {"id": "container_011"}, {"skills": [{"type": "anthropic"}]}])
def test_container_string_or_object(container: Any) -> None:
    req = accepted(body(container=container))
    assert req.model_dump(mode="json", exclude_unset=True)["container"] == container


def test_optional_fields_accept_null() -> None:
    accepted(
        body(
            system=None,
            stream=None,
            temperature=None,
            top_p=None,
            top_k=None,
            stop_sequences=None,
            tools=None,
            tool_choice=None,
            thinking=None,
            metadata=None,
            service_tier=None,
            container=None,
            mcp_servers=None,
            rid=None,
        )
    )


def test_mid_conversation_system_message_keeps_its_place() -> None:
    req = accepted(body(messages=[user("hi"), assistant("hello"), system("be brief"), user("why?")]))
    assert [m.role for m in req.messages] == ["user", "assistant", "system", "user"]


def test_all_fields_of_the_table() -> None:
    req = accepted(
        body(
            system="You are concise.",
            stream=True,
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            stop_sequences=["END", " stop "],
            service_tier="standard_only",
            rid="req-1",
        )
    )
    assert req.is_stream and req.top_k == 40 and req.rid == "req-1"
    assert not accepted(body()).is_stream


def claude_code_body() -> dict[str, Any]:
    """The shape of a Claude Code request (system blocks with cache_control, `$schema` tools, a
    JSON-string `metadata.user_id`, thinking, streaming, context management)."""
    return {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "system": [
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "You are an interactive CLI tool.", "cache_control": EPHEMERAL_1H},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                    {"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should run ls.", "signature": "EqQBCkYIBxgCKkB"},
                    {"type": "text", "text": "Listing."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01A",
                        "name": "Bash",
                        "input": {"command": "ls", "description": "List files"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01A",
                        "content": "README.md\nsrc",
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
            {"role": "system", "content": "The user changed the working directory."},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Executes a bash command",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "command": {"type": "string", "description": "The command"},
                        "timeout": {"type": "number"},
                    },
                    "required": ["command"],
                    "additionalProperties": False,
                    "$schema": "http://json-schema.org/draft-07/schema#",
                },
            },
            {
                "name": "mcp__ide__getDiagnostics",
                "description": "Get diagnostics",
                "input_schema": {
                    "type": "object",
                    "properties": {"uri": {"type": "string"}},
                    "additionalProperties": False,
                    "$schema": "http://json-schema.org/draft-07/schema#",
                },
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": json.dumps({"device_id": "abc", "account_uuid": "", "session_id": "s-1"})},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }


def test_claude_code_request_passes() -> None:
    req = accepted(claude_code_body(), beta="claude-code-20250219,interleaved-thinking-2025-05-14")
    assert req.is_stream


def test_claude_code_request_with_adaptive_thinking_passes() -> None:
    data = claude_code_body()
    data["thinking"] = {"type": "adaptive"}
    accepted(data)


def test_count_tokens_takes_the_table_fields_and_keeps_others() -> None:
    data = claude_code_body()
    del data["max_tokens"]
    req = count_accepted(data)
    assert req.model_extra is not None
    assert req.model_extra["stream"] is True and "context_management" in req.model_extra


def test_count_tokens_has_no_max_tokens_and_applies_the_same_rules() -> None:
    count_accepted({"model": "m", "messages": [user("hi")]})
    assert count_refused({"model": "m", "messages": []}).code == "empty_array"
    assert count_refused({"model": "m", "messages": [user("")]}).code == "empty_content"
    assert count_refused({"model": "m", "messages": [user("hi")], "tool_choice": {"type": "any"}}).code == (
        "tool_choice_requires_tools"
    )
    assert count_refused(
        {"model": "m", "messages": [user("hi")], "tools": [custom_tool("a"), custom_tool("a")]}
    ).code == ("duplicate_tool_names")
    toolset = {"type": "mcp_toolset", "mcp_server_name": "s"}
    assert count_refused({"model": "m", "messages": [user("hi")], "tools": [toolset]}).code == "mcp_servers_required"
    count_accepted(
        {"model": "m", "messages": [user("hi")], "tools": [toolset], "mcp_servers": [{"name": "s", "url": "https://x"}]}
    )
    assert count_refused([]).code == "invalid_body_type"
