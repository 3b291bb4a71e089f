"""Every refusal of behaviors.md B.1–B.7 with its exact message and code."""

from __future__ import annotations

from typing import Any

import pytest

from smg.protocol.errors import ApiError
from smg.protocol.tools import CustomTool, InputSchema, ServerTool
from smg.protocol.validation import check_unique_tool_names

from ._bodies import (
    accepted,
    assistant,
    body,
    custom_tool,
    refused,
    system,
    user,
)

# (body fields, exact message, code)
REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    # --- top-level fields ---
    ("model null", {"model": None}, "model: Input should be a valid string", "string_type"),
    ("model empty", {"model": ""}, "model: model field is required and cannot be empty", "string_below_min_length"),
    (
        "messages empty",
        {"messages": []},
        "messages: messages array is required and cannot be empty",
        "empty_array",
    ),
    (
        "max_tokens negative",
        {"max_tokens": -1},
        "max_tokens: Input should be greater than or equal to 0",
        "value_out_of_range",
    ),
    (
        "max_tokens over u32",
        {"max_tokens": 2**32},
        "max_tokens: Input should be less than or equal to 4294967295",
        "value_out_of_range",
    ),
    ("max_tokens float", {"max_tokens": 10.0}, "max_tokens: Input should be a valid integer", "int_type"),
    ("max_tokens bool", {"max_tokens": True}, "max_tokens: Input should be a valid integer", "int_type"),
    ("max_tokens string", {"max_tokens": "10"}, "max_tokens: Input should be a valid integer", "int_type"),
    ("top_k float", {"top_k": 1.5}, "top_k: Input should be a valid integer", "int_type"),
    ("top_k negative", {"top_k": -1}, "top_k: Input should be greater than or equal to 0", "value_out_of_range"),
    ("temperature above", {"temperature": 2.0}, "temperature: range: 0..1", "value_out_of_range"),
    ("temperature below", {"temperature": -1.0}, "temperature: range: 0..1", "value_out_of_range"),
    ("temperature string", {"temperature": "0.5"}, "temperature: Input should be a valid number", "float_type"),
    ("top_p above", {"top_p": 1.5}, "top_p: range: 0..1", "value_out_of_range"),
    (
        "stop sequence whitespace",
        {"stop_sequences": ["END", "   "]},
        "stop_sequences: each stop sequence must contain non-whitespace",
        "invalid_stop_sequence",
    ),
    (
        "stop sequence not string",
        {"stop_sequences": [1]},
        "stop_sequences.0: Input should be a valid string",
        "string_type",
    ),
    ("stream string", {"stream": "yes"}, "stream: Input should be a valid boolean", "bool_type"),
    (
        "service_tier unknown",
        {"service_tier": "priority"},
        "service_tier: Input should be 'auto' or 'standard_only'",
        "literal_error",
    ),
    (
        "metadata user_id number",
        {"metadata": {"user_id": 5}},
        "metadata.user_id: Input should be a valid string",
        "string_type",
    ),
    ("container number", {"container": 5}, "container: Input should be a valid string or object", "str_or_dict_type"),
    # --- system ---
    (
        "system image block",
        {"system": [{"type": "image", "source": {"type": "url", "url": "u"}}]},
        "system.0.type: Input should be 'text'",
        "literal_error",
    ),
    ("system number", {"system": 5}, "system: Input should be a valid string or array", "str_or_list_type"),
    # --- messages ---
    (
        "message unknown key",
        {"messages": [{"role": "user", "content": "hi", "extra": 1}]},
        "messages.0.extra: Extra inputs are not permitted",
        "extra_forbidden",
    ),
    (
        "message role",
        {"messages": [{"role": "tool", "content": "hi"}]},
        "messages.0.role: Input should be 'user', 'assistant' or 'system'",
        "literal_error",
    ),
    (
        "message content missing",
        {"messages": [{"role": "user"}]},
        "messages.0.content: Field required",
        "missing_field",
    ),
    (
        "unknown block type",
        {"messages": [user([{"type": "mcp_tool_use", "id": "x", "name": "n", "input": {}, "server_name": "s"}])]},
        "messages.0.content.0: Input tag 'mcp_tool_use' found using 'type' does not match any of the expected tags: "
        "'text', 'image', 'document', 'tool_use', 'tool_result', 'thinking', 'redacted_thinking', "
        "'server_tool_use', 'search_result', 'web_search_tool_result', 'tool_search_tool_result', "
        "'tool_reference'",
        "union_tag_invalid",
    ),
    (
        "block without type",
        {"messages": [user([{"text": "hi"}])]},
        "messages.0.content.0: Unable to extract tag using discriminator 'type'",
        "union_tag_not_found",
    ),
    (
        "text block without text",
        {"messages": [user([{"type": "text"}])]},
        "messages.0.content.0.text.text: Field required",
        "missing_field",
    ),
    (
        "image without source",
        {"messages": [user([{"type": "image"}])]},
        "messages.0.content.0.image.source: Field required",
        "missing_field",
    ),
    (
        "tool_use without input",
        {"messages": [user("q"), assistant([{"type": "tool_use", "id": "a", "name": "n"}])]},
        "messages.1.content.0.tool_use.input: Field required",
        "missing_field",
    ),
    (
        "thinking without signature",
        {"messages": [user("q"), assistant([{"type": "thinking", "thinking": "t"}])]},
        "messages.1.content.0.thinking.signature: Field required",
        "missing_field",
    ),
    # --- tools (B.4) ---
    (
        "duplicate tool names",
        {"tools": [custom_tool("a"), custom_tool("a")]},
        "tools: Tool names must be unique.",
        "duplicate_tool_names",
    ),
    (
        "duplicate across kinds, before per-tool errors",
        {"tools": [custom_tool("bad name"), custom_tool("x"), {"type": "bash_20250124", "name": "x"}]},
        "tools: Tool names must be unique.",
        "duplicate_tool_names",
    ),
    (
        "tool name too long",
        {"tools": [custom_tool("x" * 129)]},
        "tools.0.custom.name: String should have at most 128 characters",
        "tool_name_too_long",
    ),
    (
        "tool name pattern",
        {"tools": [custom_tool("get weather!")]},
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
        "invalid_tool_name",
    ),
    (
        "tool name empty",
        {"tools": [custom_tool("")]},
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
        "invalid_tool_name",
    ),
    (
        "tool name trailing newline",
        {"tools": [custom_tool("name\n")]},
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
        "invalid_tool_name",
    ),
    (
        "input_schema not object",
        {"tools": [{"name": "a", "input_schema": {"type": "string"}}]},
        "tools.0.custom.input_schema.type: Input should be 'object'",
        "invalid_input_schema_type",
    ),
    (
        "input_schema without type",
        {"tools": [{"name": "a", "input_schema": {"properties": {}}}]},
        "tools.0.custom.input_schema.type: Field required",
        "missing_field",
    ),
    (
        "custom tool without input_schema",
        {"tools": [{"name": "a"}]},
        "tools.0.custom.input_schema: Field required",
        "missing_field",
    ),
    (
        "custom tool extra field",
        {"tools": [custom_tool("ok"), custom_tool("other", foo=1)]},
        "tools.1.custom.foo: Extra inputs are not permitted",
        "unknown_tool_field",
    ),
    (
        "custom tool wrong type",
        {"tools": [{"type": 5, "name": "a"}]},
        "tools.0.custom.type: Input should be 'custom'",
        "literal_error",
    ),
    ("tool not an object", {"tools": ["a"]}, "tools.0: Input should be a valid dictionary", "invalid_tool_definition"),
    (
        "server tool without name",
        {"tools": [{"type": "web_search_20250305"}]},
        "tools.0.server.name: Field required",
        "missing_field",
    ),
    (
        "mcp_toolset without server name",
        {"tools": [{"type": "mcp_toolset"}], "mcp_servers": [{"name": "s", "url": "https://x"}]},
        "tools.0.mcp_toolset.mcp_server_name: Field required",
        "missing_field",
    ),
    (
        "mcp_servers missing",
        {"tools": [{"type": "mcp_toolset", "mcp_server_name": "s"}]},
        "mcp_servers is required when mcp_toolset tools are present",
        "mcp_servers_required",
    ),
    (
        "mcp_servers empty",
        {"tools": [{"type": "mcp_toolset", "mcp_server_name": "s"}], "mcp_servers": []},
        "mcp_servers is required when mcp_toolset tools are present",
        "mcp_servers_required",
    ),
    (
        "mcp server without url",
        {"mcp_servers": [{"type": "url", "name": "s"}]},
        "mcp_servers.0.url: Field required",
        "missing_field",
    ),
    # --- tool_choice (B.5) ---
    *[
        (
            f"tool_choice {kind} without tools",
            {"tool_choice": choice},
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            "tool_choice_requires_tools",
        )
        for kind, choice in [
            ("auto", {"type": "auto"}),
            ("any", {"type": "any"}),
            ("tool", {"type": "tool", "name": "a"}),
        ]
    ],
    (
        "tool_choice with empty tools",
        {"tools": [], "tool_choice": {"type": "auto"}},
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        "tool_choice_requires_tools",
    ),
    (
        "tool_choice names an unknown tool",
        {"tools": [custom_tool("a")], "tool_choice": {"type": "tool", "name": "b"}},
        "Invalid value for 'tool_choice': tool 'b' not found in 'tools'.",
        "tool_choice_tool_not_found",
    ),
    (
        "tool_choice names a tool disabled in mcp_toolset configs",
        {
            "tools": [
                {
                    "type": "mcp_toolset",
                    "mcp_server_name": "s",
                    "configs": {"search": {"enabled": False}},
                }
            ],
            "mcp_servers": [{"type": "url", "name": "s", "url": "https://mcp.example.com/mcp"}],
            "tool_choice": {"type": "tool", "name": "search"},
        },
        "Invalid value for 'tool_choice': tool 'search' not found in 'tools'.",
        "tool_choice_tool_not_found",
    ),
    (
        "tool_choice names a tool the mcp_toolset default disables",
        {
            "tools": [{"type": "mcp_toolset", "mcp_server_name": "s", "default_config": {"enabled": False}}],
            "mcp_servers": [{"name": "s", "url": "https://mcp.example.com/mcp"}],
            "tool_choice": {"type": "tool", "name": "search"},
        },
        "Invalid value for 'tool_choice': tool 'search' not found in 'tools'.",
        "tool_choice_tool_not_found",
    ),
    (
        "tool_choice unknown type",
        {"tools": [custom_tool("a")], "tool_choice": {"type": "required"}},
        "tool_choice: Input tag 'required' found using 'type' does not match any of the expected tags: "
        "'auto', 'any', 'tool', 'none'",
        "union_tag_invalid",
    ),
    (
        "tool_choice tool without name",
        {"tools": [custom_tool("a")], "tool_choice": {"type": "tool"}},
        "tool_choice.tool.name: Field required",
        "missing_field",
    ),
    # --- thinking (B.6) ---
    (
        "budget below 1024",
        {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 1023}},
        "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
        "thinking_budget_too_small",
    ),
    (
        "budget missing",
        {"thinking": {"type": "enabled"}},
        "thinking.enabled.budget_tokens: Field required",
        "missing_field",
    ),
    (
        "budget equals max_tokens",
        {"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 2048}},
        "thinking.budget_tokens: must be less than max_tokens (budget_tokens 2048 >= max_tokens 2048)",
        "thinking_budget_exceeds_max_tokens",
    ),
    (
        "thinking unknown type",
        {"thinking": {"type": "sometimes"}},
        "thinking: Input tag 'sometimes' found using 'type' does not match any of the expected tags: "
        "'enabled', 'adaptive', 'disabled'",
        "union_tag_invalid",
    ),
    # --- content rules (B.7) ---
    (
        "empty user string",
        {"messages": [user("")]},
        "messages.0: user messages must have non-empty content",
        "empty_content",
    ),
    (
        "empty user blocks",
        {"messages": [user([])]},
        "messages.0: user messages must have non-empty content",
        "empty_content",
    ),
    (
        "whitespace-only user message",
        {"messages": [user("hi"), assistant("ok"), user("   ")]},
        "messages.2: user messages must have non-empty content",
        "empty_content",
    ),
    (
        "empty assistant that is not final",
        {"messages": [user("hi"), assistant(""), user("again")]},
        "messages.1: assistant messages must have non-empty content",
        "empty_content",
    ),
    (
        "empty final assistant followed by a system message",
        {"messages": [user("hi"), assistant(""), system("s")]},
        "messages.1: assistant messages must have non-empty content",
        "empty_content",
    ),
    (
        "empty text block",
        {"messages": [user([{"type": "text", "text": ""}])]},
        "messages.0: text content blocks must be non-empty",
        "empty_text_block",
    ),
    (
        "whitespace text block in final assistant",
        {"messages": [user("hi"), assistant([{"type": "text", "text": " \n"}])]},
        "messages.1: text content blocks must be non-empty",
        "empty_text_block",
    ),
    (
        "prefill string trailing space",
        {"messages": [user("hi"), assistant("The answer is ")]},
        "messages: final assistant content cannot end with trailing whitespace",
        "prefill_trailing_whitespace",
    ),
    (
        "prefill whitespace-only string",
        {"messages": [user("hi"), assistant("  ")]},
        "messages: final assistant content cannot end with trailing whitespace",
        "prefill_trailing_whitespace",
    ),
    (
        "prefill last text block trailing newline",
        {"messages": [user("hi"), assistant([{"type": "text", "text": "The answer is\n"}])]},
        "messages: final assistant content cannot end with trailing whitespace",
        "prefill_trailing_whitespace",
    ),
]


@pytest.mark.parametrize(
    ("fields", "message", "code"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_refusal(fields: dict[str, Any], message: str, code: str) -> None:
    error = refused(body(**fields))
    assert error.message == message
    assert error.code == code


def test_missing_required_fields() -> None:
    for name in ("model", "messages", "max_tokens"):
        data = body()
        del data[name]
        error = refused(data)
        assert error.message == f"{name}: Field required"
        assert error.code == "missing_field"


@pytest.mark.parametrize("data", [[], "x", 1, None, True, [{"model": "m"}]])
def test_top_level_must_be_an_object(data: object) -> None:
    error = refused(data)
    assert error.message == "request body must be a JSON object"
    assert error.code == "invalid_body_type"


def test_max_tokens_zero_is_valid() -> None:
    assert accepted(body(max_tokens=0)).max_tokens == 0


def test_budget_at_max_tokens_passes_with_interleaved_thinking_beta() -> None:
    data = body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 4096})
    beta = "fine-grained-tool-streaming-2025-05-14,interleaved-thinking-2025-05-14"
    assert accepted(data, beta=beta).thinking is not None
    refused(data, beta="fine-grained-tool-streaming-2025-05-14")


def test_budget_with_max_tokens_zero_passes() -> None:
    accepted(body(max_tokens=0, thinking={"type": "enabled", "budget_tokens": 4096}))


def test_budget_below_max_tokens_and_thinking_with_temperature_pass() -> None:
    accepted(body(max_tokens=4096, temperature=0.6, thinking={"type": "enabled", "budget_tokens": 1024}))


def test_budget_rule_only_applies_to_enabled_thinking() -> None:
    accepted(body(max_tokens=16, thinking={"type": "adaptive"}))
    accepted(body(max_tokens=16, thinking={"type": "disabled"}))


def test_sampling_bounds_are_inclusive_and_ints_are_numbers() -> None:
    accepted(body(temperature=1.0, top_p=0.0))
    accepted(body(temperature=1, top_p=0, top_k=0))


def test_tool_choice_none_without_tools_is_valid() -> None:
    accepted(body(tool_choice={"type": "none"}))


@pytest.mark.parametrize("kind", ["auto", "any"])
def test_tool_choice_with_tools_is_valid(kind: str) -> None:
    accepted(body(tools=[custom_tool("a")], tool_choice={"type": kind, "disable_parallel_tool_use": True}))


def test_tool_choice_names_a_declared_tool() -> None:
    accepted(body(tools=[custom_tool("a")], tool_choice={"type": "tool", "name": "a"}))
    accepted(
        body(
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            tool_choice={"type": "tool", "name": "web_search"},
        )
    )


MCP_SERVERS = [{"type": "url", "name": "s", "url": "https://mcp.example.com/mcp"}]


def test_tool_choice_matches_any_name_of_an_mcp_toolset_without_configs() -> None:
    accepted(
        body(
            tools=[{"type": "mcp_toolset", "mcp_server_name": "s"}],
            mcp_servers=MCP_SERVERS,
            tool_choice={"type": "tool", "name": "anything"},
        )
    )


def test_tool_choice_uses_the_mcp_toolset_default_when_no_override() -> None:
    accepted(
        body(
            tools=[
                {
                    "type": "mcp_toolset",
                    "mcp_server_name": "s",
                    "default_config": {"enabled": True},
                    "configs": {"other": {"enabled": False}},
                }
            ],
            mcp_servers=MCP_SERVERS,
            tool_choice={"type": "tool", "name": "search"},
        )
    )


def test_tool_choice_per_tool_enable_overrides_a_disabled_default() -> None:
    accepted(
        body(
            tools=[
                {
                    "type": "mcp_toolset",
                    "mcp_server_name": "s",
                    "default_config": {"enabled": False, "defer_loading": True},
                    "configs": {"search": {"enabled": True}},
                }
            ],
            mcp_servers=MCP_SERVERS,
            tool_choice={"type": "tool", "name": "search"},
        )
    )


def test_content_rules_exempt_system_messages() -> None:
    accepted(
        body(
            messages=[
                user("hi"),
                system([]),
                system([{"type": "text", "text": ""}]),
                user("again"),
            ]
        )
    )


def test_empty_final_assistant_prefill_is_valid() -> None:
    accepted(body(messages=[user("hi"), assistant("")]))
    accepted(body(messages=[user("hi"), assistant([])]))


def test_prefill_ending_in_a_non_text_block_is_not_checked_for_whitespace() -> None:
    accepted(
        body(
            messages=[
                user("hi"),
                assistant([{"type": "text", "text": "a "}, {"type": "thinking", "thinking": "t", "signature": "s"}]),
            ]
        )
    )


def test_trailing_whitespace_is_fine_outside_the_final_assistant() -> None:
    accepted(body(messages=[user("hi "), assistant("ok "), user("more\n")]))


def test_valid_tool_names() -> None:
    accepted(body(tools=[custom_tool("get_weather-v2"), custom_tool("other"), custom_tool("x" * 128)]))


def test_mcp_toolset_entries_have_no_name_for_uniqueness() -> None:
    toolset = {"type": "mcp_toolset", "mcp_server_name": "s"}
    accepted(body(tools=[toolset, dict(toolset)], mcp_servers=MCP_SERVERS))


def test_unique_tool_names_on_tools_built_in_code() -> None:
    schema = InputSchema(type="object")
    check_unique_tool_names([CustomTool(name="a", input_schema=schema), ServerTool(type="bash_20250124", name="b")])
    with pytest.raises(ApiError) as info:
        check_unique_tool_names([CustomTool(name="a", input_schema=schema), ServerTool(type="bash_20250124", name="a")])
    assert (info.value.message, info.value.code) == ("tools: Tool names must be unique.", "duplicate_tool_names")
