"""Sans-IO parts of the MCP tool loop: trigger, tool exposure, request rewriting, the stream
rewriter (exact event sequences), ids and result blocks, and the policy file."""

from __future__ import annotations

from typing import Any

import pytest

from smg.mcp import McpConfigError, wants_loop
from smg.mcp.blocks import assistant_input, mcp_id, mcp_tool_result, tool_result
from smg.mcp.client import McpTool, ServerSpec, result_text
from smg.mcp.config import McpConfig, parse_mcp_config
from smg.mcp.streaming import StreamRewriteError, StreamRewriter
from smg.mcp.toolset import exposed_tools, rewrite_request, toolsets
from smg.protocol.errors import describe_exception as describe
from smg.protocol.fold import BlockFold
from smg.protocol.parse import parse_create_message

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}


def request(**extra: Any) -> Any:
    data = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
        "mcp_servers": [
            {"type": "url", "name": "a", "url": "http://a/mcp"},
            {"type": "url", "name": "b", "url": "http://b/mcp"},
        ],
        "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}],
        **extra,
    }
    return parse_create_message(data)


def listed(server: str, *names: str) -> list[McpTool]:
    return [McpTool(server, name, f"{name} tool", dict(SCHEMA)) for name in names]


# -- trigger ----------------------------------------------------------------------------------


def test_the_loop_needs_the_header_and_a_toolset() -> None:
    with_toolset = request()
    assert wants_loop({"x-smg-mcp": "enabled"}, with_toolset)
    assert wants_loop({"X-SMG-MCP": " ENABLED "}, with_toolset)
    assert not wants_loop({}, with_toolset)
    assert not wants_loop({"x-smg-mcp": "true"}, with_toolset)
    without = request(tools=[{"name": "t", "input_schema": {"type": "object"}}])
    assert not wants_loop({"x-smg-mcp": "enabled"}, without)


# -- exposure ---------------------------------------------------------------------------------


def expose(*sets: dict[str, Any], tools: dict[str, list[McpTool]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    req = request(tools=list(sets))
    return exposed_tools(toolsets(req), tools)


def test_without_configs_every_tool_is_exposed_unless_disabled_by_default() -> None:
    tools = {"a": listed("a", "x", "y")}
    defs, owners = expose({"type": "mcp_toolset", "mcp_server_name": "a"}, tools=tools)
    assert defs == [
        {"name": "x", "description": "x tool", "input_schema": SCHEMA},
        {"name": "y", "description": "y tool", "input_schema": SCHEMA},
    ]
    assert owners == {"x": "a", "y": "a"}
    off = {"type": "mcp_toolset", "mcp_server_name": "a", "default_config": {"enabled": False}}
    assert expose(off, tools=tools) == ([], {})


def test_configs_list_the_only_tools_exposed() -> None:
    tools = {"a": listed("a", "x", "y", "z")}
    toolset = {
        "type": "mcp_toolset",
        "mcp_server_name": "a",
        "default_config": {"enabled": False, "defer_loading": True},
        "configs": {"x": {"enabled": True}, "y": {}, "z": {"enabled": True, "defer_loading": False}},
    }
    defs, owners = expose(toolset, tools=tools)
    assert [(d["name"], d.get("defer_loading")) for d in defs] == [("x", True), ("z", None)]
    assert owners == {"x": "a", "z": "a"}


def test_first_toolset_per_server_wins_and_shared_names_go_to_the_first_server() -> None:
    tools = {"a": listed("a", "x"), "b": listed("b", "x", "w")}
    defs, owners = expose(
        {"type": "mcp_toolset", "mcp_server_name": "a"},
        {"type": "mcp_toolset", "mcp_server_name": "a", "default_config": {"enabled": False}},
        {"type": "mcp_toolset", "mcp_server_name": "b"},
        tools=tools,
    )
    assert [d["name"] for d in defs] == ["x", "w"] and owners == {"x": "a", "w": "b"}


def test_a_toolset_of_a_server_that_did_not_connect_exposes_nothing() -> None:
    assert expose({"type": "mcp_toolset", "mcp_server_name": "b"}, tools={"a": listed("a", "x")}) == ([], {})


def test_a_schema_without_type_is_an_object() -> None:
    (definition,), _ = exposed_tools(toolsets(request()), {"a": [McpTool("a", "x", None, {"properties": {}})]})
    assert definition == {"name": "x", "input_schema": {"properties": {}, "type": "object"}}


def test_rewrite_keeps_unknown_fields_and_defaults_tool_choice_to_auto() -> None:
    custom = {"name": "mine", "input_schema": {"type": "object"}}
    body = {
        "model": "alias", "max_tokens": 5, "messages": [], "temperature": None, "context_management": {"k": 1},
        "mcp_servers": [{"name": "a"}], "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}, custom],
    }  # fmt: skip
    out = rewrite_request(body, "canonical", [{"name": "x", "input_schema": SCHEMA}])
    assert out == {
        "model": "canonical", "max_tokens": 5, "messages": [], "context_management": {"k": 1},
        "tools": [custom, {"name": "x", "input_schema": SCHEMA}], "tool_choice": {"type": "auto"},
    }  # fmt: skip
    assert rewrite_request({**body, "tool_choice": {"type": "none"}}, "m", [])["tool_choice"] == {"type": "none"}
    only_mcp = {**body, "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}]}
    assert "tools" not in rewrite_request(only_mcp, "m", []) and "tool_choice" not in rewrite_request(only_mcp, "m", [])


# -- the stream rewriter ----------------------------------------------------------------------


def round_events(msg_id: str, blocks: list[dict[str, Any]], stop: str, usage: tuple[int, int]) -> list[dict[str, Any]]:
    start = {
        "id": msg_id, "type": "message", "role": "assistant", "content": [], "model": "m",
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": usage[0], "output_tokens": 1},
    }  # fmt: skip
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for i, block in enumerate(blocks):
        events.append({"type": "content_block_start", "index": i, "content_block": block})
        if block["type"] == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": '{"q": "x"}'}
            events.append({"type": "content_block_delta", "index": i, "delta": delta})
        events.append({"type": "content_block_stop", "index": i})
    events.append({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": usage[1]}})
    events.append({"type": "message_stop"})
    return events


def test_rewriter_reindexes_rounds_and_closes_once() -> None:
    rewriter = StreamRewriter({"search": "srv"})
    out: list[dict[str, Any]] = []
    rewriter.begin_round()
    tool = {"type": "tool_use", "id": "toolu_9", "name": "search", "input": {}}
    for event in round_events("msg_1", [{"type": "text", "text": "a"}, tool], "tool_use", (10, 4)):
        out += rewriter.feed(event)
    assert rewriter.current.complete and rewriter.current.tool_uses() == [dict(tool, input={"q": "x"})]
    out += rewriter.tool_result("toolu_9", "found", False)
    rewriter.begin_round()
    out += rewriter.feed({"type": "ping"})
    for event in round_events("msg_2", [{"type": "text", "text": "b"}], "end_turn", (20, 6)):
        out += rewriter.feed(event)
    out += rewriter.finish()
    assert [(e["type"], e.get("index")) for e in out] == [
        ("message_start", None),
        ("content_block_start", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_stop", 2),
        ("ping", None),
        ("content_block_start", 3), ("content_block_stop", 3),
        ("message_delta", None), ("message_stop", None),
    ]  # fmt: skip
    assert out[0]["message"]["id"] == "msg_1"
    assert out[3]["content_block"] == {
        "type": "mcp_tool_use", "id": "mcptoolu_9", "name": "search", "server_name": "srv", "input": {},
    }  # fmt: skip
    assert out[6]["content_block"] == {
        "type": "mcp_tool_result", "tool_use_id": "mcptoolu_9", "is_error": False,
        "content": [{"type": "text", "text": "found"}],
    }  # fmt: skip
    assert out[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": 30, "output_tokens": 10},
    }


def test_rewriter_refuses_wild_indices() -> None:
    rewriter = StreamRewriter({})
    rewriter.begin_round()
    with pytest.raises(StreamRewriteError, match=r"index 1025 exceeds maximum \(1024\)"):
        rewriter.feed({"type": "content_block_start", "index": 1025, "content_block": {"type": "text", "text": ""}})
    with pytest.raises(StreamRewriteError, match="never started"):
        rewriter.feed({"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}})


def test_block_fold_builds_what_the_model_is_sent_back() -> None:
    fold = BlockFold()
    for event in [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}},
        },
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{bad"}},
        {"type": "content_block_stop", "index": 2},
    ]:
        fold.feed(event)
    assert assistant_input(fold.content()) == [
        {"type": "thinking", "thinking": "hm", "signature": "sig"},
        {"type": "tool_use", "id": "t", "name": "n", "input": {}},  # empty text dropped, bad JSON → {}
    ]


# -- ids, results, policy ---------------------------------------------------------------------


def test_ids_and_result_blocks() -> None:
    assert mcp_id("toolu_01AbC") == "mcptoolu_01AbC" and mcp_id("call_7") == "mcptoolu_call_7"
    assert mcp_tool_result("toolu_1", "ok", False)["is_error"] is None
    assert mcp_tool_result("toolu_1", "no", True)["is_error"] is True
    assert tool_result("toolu_1", "ok", False) == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}


def test_result_text_joins_texts_and_falls_back_to_json() -> None:
    from mcp.types import CallToolResult, ImageContent, TextContent

    both = CallToolResult(content=[TextContent(type="text", text="a"), TextContent(type="text", text="b")])
    assert result_text(both) == "a\nb"
    image = CallToolResult(content=[ImageContent(type="image", data="AA==", mime_type="image/png")])
    assert result_text(image) == '{"type":"image","data":"AA==","mimeType":"image/png"}'
    assert result_text(CallToolResult(content=[], structured_content={"n": 1})) == '{"n":1}'


def test_urls_are_reported_without_userinfo_and_groups_unwrapped() -> None:
    assert ServerSpec("s", "https://user:pw@h.example:8443/mcp?key=k").public_url == "https://h.example:8443/mcp"
    assert (
        describe(ExceptionGroup("g", [ExceptionGroup("h", [ConnectionError("refused")])])) == "ConnectionError: refused"
    )


def test_policy_file_yaml_and_json() -> None:
    config = parse_mcp_config(
        "policy:\n  default: deny\n  servers:\n    s:\n      default: allow\n      tools: {rm: deny}\n"
        "call_timeout_secs: 5\n"
    )
    assert config.allows("s", "ls") and not config.allows("s", "rm") and not config.allows("other", "ls")
    assert config.call_timeout_secs == 5.0 and config.connect_timeout_secs == 10.0
    assert parse_mcp_config('{"policy": {"servers": {"s": {"tools": {"x": "deny"}}}}}').allows("s", "y")
    assert parse_mcp_config("") == McpConfig() and McpConfig().allows("any", "tool")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("policy:\n  defualt: deny\n", "unknown key(s) defualt"),
        ("policy:\n  default: maybe\n", "must be allow or deny"),
        ("policy:\n  servers:\n    s:\n      tools: {x: yes}\n", "must be allow or deny"),
        ("connect_timeout_secs: -1\n", "positive number"),
        ("serverz: []\n", "unknown key(s) serverz"),
        ("- just a list\n", "must be a mapping"),
    ],
)
def test_policy_file_mistakes_are_refused(text: str, needle: str) -> None:
    with pytest.raises(McpConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_mcp_config(text)


def test_launch_takes_the_anthropic_backend_and_checks_the_mcp_config(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from smg.cli.main import app

    base = ["launch", "--worker-urls", "https://api.anthropic.com", "--backend", "anthropic"]
    bad = tmp_path / "mcp.yaml"
    bad.write_text("policy:\n  default: perhaps\n")
    for path, needle in ((bad, "must be allow or deny"), (tmp_path / "missing.yaml", "cannot read MCP config")):
        result = CliRunner().invoke(app, [*base, "--mcp-config-path", str(path)])
        assert result.exit_code == 2 and needle in result.output, result.output
