"""The MCP tool loop end to end (behaviors.md §I): gateway, scripted Anthropic upstream and real
MCP servers as processes; the journal tells each request's story."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import Scripted, wait_for_events
from tests.mcp.conftest import TOKEN, McpServers
from tools import anthropic_answers as answers
from tools.anthropic_answers import message, parse_sse, text, tool_use
from tools.spawn import free_port

MODEL = "claude-sonnet-4-20250514"
CREDS = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01", "anthropic-beta": "b1"}
LOOP = {**CREDS, "X-SMG-MCP": "Enabled"}
WEATHER = "Sunny, 21°C in Paris"


def body(mcp: McpServers, *, stream: bool = False, servers: list[dict] | None = None, **extra: Any) -> dict:
    out = {
        "model": MODEL,
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "mcp_servers": servers or [{"type": "url", "name": "wx", "url": mcp.url("answer")}],
        "tools": [{"type": "mcp_toolset", "mcp_server_name": s["name"]} for s in servers or [{"name": "wx"}]],
        **extra,
    }
    if stream:
        out["stream"] = True
    return out


def kinds(events: list) -> list[str]:
    return [e.kind for e in events]


def sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    return parse_sse(response.content)


# -- one round of tools, both ways ------------------------------------------------------------


def test_non_streaming_round_trip(gw: httpx.Client, scripted: Scripted, mcp: McpServers, mcp_journal: Path) -> None:
    turn = message(text("Let me check."), tool_use("get_weather", {"city": "Paris"}, id="toolu_01A"), usage=(20, 10))
    final = message(text("It is sunny in Paris."), usage=(45, 8), model=MODEL)
    scripted.script(answers.json_answer(turn), answers.json_answer(final))
    response = gw.post("/v1/messages", json=body(mcp), headers=LOOP)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "id": final["id"],
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "mcp_tool_use", "id": "mcptoolu_01A", "name": "get_weather", "server_name": "wx",
             "input": {"city": "Paris"}},
            {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_01A",
             "content": [{"type": "text", "text": WEATHER}], "is_error": None},
            {"type": "text", "text": "It is sunny in Paris."},
        ],
        "model": MODEL,
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 45, "output_tokens": 8},  # the last response's, not summed
    }  # fmt: skip
    assert b'"is_error":null' in response.content

    first, second = scripted.received()
    for sent in (first, second):
        assert set(sent["headers"]) - {"host", "content-length", "x-smg-hops"} == {
            "x-api-key", "anthropic-version", "anthropic-beta", "content-type",
        }  # fmt: skip
    sent = first["json"]
    assert "mcp_servers" not in sent and "stream" not in sent
    assert [t["name"] for t in sent["tools"]] == ["get_weather", "add", "echo", "lookup"]
    assert all(t["input_schema"]["type"] == "object" for t in sent["tools"])
    assert sent["tools"][0]["description"] == "The weather in a city"
    assert sent["tool_choice"] == {"type": "auto"}
    assert second["json"]["messages"] == [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": WEATHER}]},
    ]  # fmt: skip
    assert [c["tool"] for c in mcp.calls("answer")] == ["get_weather"]

    events = wait_for_events(mcp_journal, response.headers["x-request-id"])
    story = kinds(events)
    assert story[:11] == [
        "received", "validated", "routed", "mcp_connect", "model_call", "model_result",
        "mcp_call", "mcp_result", "model_call", "model_result", "block",
    ]  # fmt: skip
    assert story[-1] == "completed" and set(story[11:-1]) == {"block"}
    connect, call1, result1, mcp_call, mcp_result, call2 = (
        events[3],
        events[4],
        events[5],
        events[6],
        events[7],
        events[8],
    )
    assert (connect.server, connect.ok, connect.tools) == ("wx", True, ["get_weather", "add", "echo", "lookup"])
    assert call1.round == 1 and call1.request["tool_choice"] == {"type": "auto"}
    assert orjson.loads(result1.data) == turn and result1.tool_uses == ["get_weather"]
    assert (mcp_call.round, mcp_call.server, mcp_call.tool, mcp_call.id) == (1, "wx", "get_weather", "mcptoolu_01A")
    assert (mcp_result.is_error, mcp_result.content) == (False, WEATHER)
    assert call2.round == 2 and call2.request is None and len(call2.added) == 2


def test_streaming_round_trip(gw: httpx.Client, scripted: Scripted, mcp: McpServers, mcp_journal: Path) -> None:
    turn = message(text("Checking."), tool_use("get_weather", {"city": "Paris"}, id="toolu_01B"), usage=(20, 10))
    final = message(text("Sunny!"), usage=(40, 8))
    scripted.script(answers.sse_answer(turn, ping=True), answers.sse_answer(final))
    response = gw.post("/v1/messages", json=body(mcp, stream=True), headers=LOOP)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    events = sse(response)
    assert [name for name, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    payloads = [p for _, p in events]
    assert payloads[0]["message"]["id"] == turn["id"]  # the first round's message_start only
    assert [p.get("index") for p in payloads[2:15]] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 3]
    assert payloads[6]["content_block"] == {
        "type": "mcp_tool_use", "id": "mcptoolu_01B", "name": "get_weather", "server_name": "wx", "input": {},
    }  # fmt: skip
    assert payloads[7]["delta"] == {"type": "input_json_delta", "partial_json": '{"city":"Paris"}'}
    assert payloads[9]["content_block"] == {
        "type": "mcp_tool_result", "tool_use_id": "mcptoolu_01B", "is_error": False,
        "content": [{"type": "text", "text": WEATHER}],
    }  # fmt: skip
    assert payloads[15] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": 60, "output_tokens": 18},  # summed over both rounds
    }
    first, second = scripted.received()
    assert first["json"]["stream"] is True and second["json"]["stream"] is True
    assert second["json"]["messages"][1]["content"][1] == {
        "type": "tool_use", "id": "toolu_01B", "name": "get_weather", "input": {"city": "Paris"},
    }  # fmt: skip
    story = kinds(wait_for_events(mcp_journal, response.headers["x-request-id"]))
    assert story[:6] == ["received", "validated", "routed", "mcp_connect", "stream_opened", "model_call"]
    assert story.count("model_call") == 2 and story.count("mcp_call") == 1 and story[-1] == "completed"


def test_calls_run_one_after_another_in_order(gw: httpx.Client, scripted: Scripted, mcp: McpServers) -> None:
    turn = message(
        tool_use("add", {"a": 2, "b": 3}, id="toolu_1"), text("and"), tool_use("lookup", {"key": "k"}, id="toolu_2")
    )
    scripted.script(answers.json_answer(turn), answers.json_answer(message(text("done"))))
    response = gw.post("/v1/messages", json=body(mcp), headers=LOOP)
    content = response.json()["content"]
    assert [(b["type"], b.get("id") or b.get("tool_use_id") or b.get("text")) for b in content] == [
        ("mcp_tool_use", "mcptoolu_1"), ("mcp_tool_result", "mcptoolu_1"), ("text", "and"),
        ("mcp_tool_use", "mcptoolu_2"), ("mcp_tool_result", "mcptoolu_2"), ("text", "done"),
    ]  # fmt: skip
    assert content[1]["content"][0]["text"] == "5" and content[4]["content"][0]["text"] == "value-of-k"
    calls = mcp.calls("answer")
    assert [c["tool"] for c in calls] == ["add", "lookup"] and calls[0]["time"] <= calls[1]["time"]
    results = scripted.received()[1]["json"]["messages"][2]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_1", "toolu_2"]


# -- which tools, and which servers -----------------------------------------------------------


def test_toolset_configs_pick_tools_and_defer_loading(gw: httpx.Client, scripted: Scripted, mcp: McpServers) -> None:
    custom = {"name": "local_tool", "description": "the client's own", "input_schema": {"type": "object"}}
    toolset = {
        "type": "mcp_toolset",
        "mcp_server_name": "wx",
        "default_config": {"enabled": False, "defer_loading": True},
        "configs": {"get_weather": {"enabled": True}, "add": {}, "echo": {"enabled": True, "defer_loading": False}},
    }
    request = body(mcp, tool_choice={"type": "any"})
    request["tools"] = [custom, toolset]
    scripted.script(answers.json_answer(message(text("no tools needed"))))
    response = gw.post("/v1/messages", json=request, headers=LOOP)
    assert response.status_code == 200
    assert response.json()["content"] == [{"type": "text", "text": "no tools needed"}]
    (sent,) = scripted.received()
    assert sent["json"]["tools"] == [
        custom,
        {"name": "get_weather", "description": "The weather in a city", "defer_loading": True,
         "input_schema": sent["json"]["tools"][1]["input_schema"]},
        {"name": "echo", "description": "Echo the text back", "input_schema": sent["json"]["tools"][2]["input_schema"]},
    ]  # fmt: skip
    assert sent["json"]["tool_choice"] == {"type": "any"}  # the client's choice is kept


def test_servers_that_fail_to_connect_are_skipped(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers, mcp_journal: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    servers = [
        {"type": "url", "name": "wx", "url": mcp.url("answer")},
        {"type": "url", "name": "gone", "url": dead},
        {"type": "url", "name": "legacy", "url": mcp.url("answer").replace("/mcp", "/sse")},
    ]
    scripted.script(answers.json_answer(message(text("ok"))))
    response = gw.post("/v1/messages", json=body(mcp, servers=servers), headers=LOOP)
    assert response.status_code == 200
    (sent,) = scripted.received()
    assert [t["name"] for t in sent["json"]["tools"]] == ["get_weather", "add", "echo", "lookup"]
    connects = [e for e in wait_for_events(mcp_journal, response.headers["x-request-id"]) if e.kind == "mcp_connect"]
    assert [(c.server, c.ok) for c in connects] == [("wx", True), ("gone", False), ("legacy", False)]
    assert "ConnectError" in connects[1].error and "legacy SSE" in connects[2].error


@pytest.mark.parametrize("stream", [False, True])
def test_no_server_connecting_is_502_before_any_stream(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers, stream: bool
) -> None:
    servers = [{"type": "url", "name": "gone", "url": f"http://127.0.0.1:{free_port()}/mcp"}]
    response = gw.post("/v1/messages", json=body(mcp, servers=servers, stream=stream), headers=LOOP)
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-smg-error-code"] == "mcp_connection_failed"
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "Failed to connect to MCP servers. Check server URLs and authorization.",
        },
        "request_id": response.headers["x-request-id"],
    }
    assert scripted.received() == []


def test_the_bearer_token_reaches_its_server_and_nowhere_else(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers, mcp_journal: Path
) -> None:
    servers = [{"type": "url", "name": "vault", "url": mcp.url("auth"), "authorization_token": TOKEN}]
    scripted.script(
        answers.json_answer(message(tool_use("whoami", {}, id="toolu_w"))), answers.json_answer(message(text("ok")))
    )
    response = gw.post("/v1/messages", json=body(mcp, servers=servers), headers=LOOP)
    assert response.status_code == 200, response.text
    assert response.json()["content"][1]["content"][0]["text"] == "an authorized caller"
    assert set(mcp.authorization("auth")) == {f"Bearer {TOKEN}"}
    assert all(TOKEN not in r["body"] and TOKEN not in str(r["headers"]) for r in scripted.received())
    wait_for_events(mcp_journal, response.headers["x-request-id"])
    journal_bytes = b"".join(p.read_bytes() for p in mcp_journal.parent.glob(mcp_journal.name + "*"))
    assert TOKEN.encode() not in journal_bytes

    wrong = [{**servers[0], "authorization_token": "not-the-token"}]
    refused = gw.post("/v1/messages", json=body(mcp, servers=wrong), headers=LOOP)
    assert refused.status_code == 502 and refused.headers["x-smg-error-code"] == "mcp_connection_failed"


# -- tools that fail, and tools the policy refuses --------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_tool_is_an_error_result(gw: httpx.Client, scripted: Scripted, mcp: McpServers, stream: bool) -> None:
    servers = [{"type": "url", "name": "boom", "url": mcp.url("fail")}]
    turn = message(tool_use("explode", {"reason": "kaput"}, id="toolu_x"))
    make = answers.sse_answer if stream else answers.json_answer
    scripted.script(make(turn), make(message(text("It failed."))))
    response = gw.post("/v1/messages", json=body(mcp, servers=servers, stream=stream), headers=LOOP)
    assert response.status_code == 200
    if stream:
        starts = [p["content_block"] for n, p in sse(response) if n == "content_block_start"]
        result = next(b for b in starts if b["type"] == "mcp_tool_result")
        assert result["is_error"] is True
    else:
        result = response.json()["content"][1]
        assert result["is_error"] is True
    failure = "Error executing tool explode: tool exploded: kaput"  # the server's own words
    assert result["content"] == [{"type": "text", "text": failure}]
    sent = scripted.received()[1]["json"]["messages"][2]["content"][0]
    assert sent == {
        "type": "tool_result",
        "tool_use_id": "toolu_x",
        "content": failure,
        "is_error": True,
    }


def test_the_policy_can_deny_a_tool(gw: httpx.Client, scripted: Scripted, mcp: McpServers, mcp_journal: Path) -> None:
    scripted.script(
        answers.json_answer(message(tool_use("echo", {"text": "hi"}, id="toolu_e"))),
        answers.json_answer(message(text("denied, fine"))),
    )
    response = gw.post("/v1/messages", json=body(mcp), headers=LOOP)
    assert response.status_code == 200
    result = response.json()["content"][1]
    assert result["is_error"] is True and "denied" in result["content"][0]["text"]
    assert mcp.calls("answer") == []  # never sent to the server
    calls = [e for e in wait_for_events(mcp_journal, response.headers["x-request-id"]) if e.kind == "mcp_call"]
    assert [(c.tool, c.allowed) for c in calls] == [("echo", False)]


# -- limits and failures ----------------------------------------------------------------------


def test_non_streaming_gives_up_after_ten_rounds(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers, mcp_journal: Path
) -> None:
    scripted.script(*[answers.json_answer(message(tool_use("add", {"a": i, "b": 1}))) for i in range(11)])
    response = gw.post("/v1/messages", json=body(mcp), headers=LOOP)
    assert response.status_code == 502
    assert response.headers["x-smg-error-code"] == "mcp_max_iterations"
    assert response.json()["error"]["message"] == "MCP tool loop exceeded maximum iterations (10)"
    assert len(scripted.received()) == 11 and len(mcp.calls("answer")) == 10
    story = kinds(wait_for_events(mcp_journal, response.headers["x-request-id"]))
    assert story.count("model_call") == 11 and story.count("mcp_call") == 10 and "block" not in story


def test_a_stream_ends_with_an_error_event_right_after_the_tenth_round(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers
) -> None:
    scripted.script(*[answers.sse_answer(message(tool_use("add", {"a": i, "b": 1}))) for i in range(11)])
    response = gw.post("/v1/messages", json=body(mcp, stream=True), headers=LOOP)
    assert response.status_code == 200
    events = sse(response)
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "MCP tool loop exceeded maximum iterations (10)"}},
    )
    assert events[-2][0] == "content_block_stop"  # the tenth round's last result, then the error
    results = [p for n, p in events if n == "content_block_start" and p["content_block"]["type"] == "mcp_tool_result"]
    assert len(results) == 10 and "message_delta" not in [n for n, _ in events]
    assert len(scripted.received()) == 10  # no eleventh call
    assert len(mcp.calls("answer")) == 10


def test_a_first_call_failure_is_an_error_event_in_a_stream(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers
) -> None:
    scripted.script(answers.error_answer(529, "overloaded_error", "Overloaded"))
    response = gw.post("/v1/messages", json=body(mcp, stream=True), headers=LOOP)
    assert response.status_code == 200
    assert sse(response) == [
        (
            "error",
            {
                "type": "error",
                "error": {"type": "api_error", "message": "Worker returned error status: 529: Overloaded"},
            },
        )
    ]


def test_a_failure_mid_loop_keeps_the_upstream_error(gw: httpx.Client, scripted: Scripted, mcp: McpServers) -> None:
    scripted.script(
        answers.json_answer(message(tool_use("add", {"a": 1, "b": 1}))),
        answers.error_answer(429, "rate_limit_error", "slow down", headers={"retry-after": "3"}),
    )
    response = gw.post("/v1/messages", json=body(mcp), headers=LOOP)
    assert response.status_code == 429
    assert response.json() == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
        "request_id": response.headers["x-request-id"],
    }
    assert response.headers["retry-after"] == "3"


def test_an_upstream_error_event_ends_the_stream(gw: httpx.Client, scripted: Scripted, mcp: McpServers) -> None:
    start = answers.stream_events(message(text("x")))[0]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    scripted.script({"sse": [{"event": "message_start", "data": start}, {"event": "error", "data": error}]})
    response = gw.post("/v1/messages", json=body(mcp, stream=True), headers=LOOP)
    assert sse(response) == [("message_start", start), ("error", error)]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_without_stop_reason_tool_use_are_not_run(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers, stream: bool
) -> None:
    turn = message(tool_use("add", {"a": 1, "b": 2}), stop_reason="end_turn")
    scripted.script(answers.sse_answer(turn) if stream else answers.json_answer(turn))
    response = gw.post("/v1/messages", json=body(mcp, stream=stream), headers=LOOP)
    expected = "Model returned 1 tool_use block(s) but stop_reason is end_turn; tool calls will not be executed"
    if stream:
        assert sse(response)[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": expected}})
    else:
        assert response.status_code == 502 and response.headers["x-smg-error-code"] == "mcp_tool_loop_error"
        assert response.json()["error"]["message"] == expected
    assert mcp.calls("answer") == []


def test_an_unparseable_answer_mid_loop_is_502_parse_error(
    gw: httpx.Client, scripted: Scripted, mcp: McpServers
) -> None:
    scripted.script(answers.json_answer(message(tool_use("add", {"a": 1, "b": 1}))), {"body": "<html>oops</html>"})
    response = gw.post("/v1/messages", json=body(mcp), headers=LOOP)
    assert response.status_code == 502 and response.headers["x-smg-error-code"] == "parse_error"


# -- the journal and a real client ------------------------------------------------------------


def test_journal_show_tells_the_story(gw: httpx.Client, scripted: Scripted, mcp: McpServers, mcp_journal: Path) -> None:
    scripted.script(
        answers.json_answer(message(tool_use("get_weather", {"city": "Paris"}, id="toolu_s"))),
        answers.json_answer(message(text("Sunny."))),
    )
    response = gw.post("/v1/messages", json=body(mcp), headers=LOOP)
    rid = response.headers["x-request-id"]
    wait_for_events(mcp_journal, rid)
    shown = subprocess.run(
        [sys.executable, "-m", "smg", "journal", "show", rid, "--journal", str(mcp_journal)],
        capture_output=True, text=True, check=True, env={"COLUMNS": "200", "PATH": ""},
    ).stdout  # fmt: skip
    for needle in ("mcp_connect", "model_call", "model_result", "mcp_call", "mcp_result", "wx.get_weather",
                   "mcptoolu_s", "round 2", "mcp_tool_result"):  # fmt: skip
        assert needle in shown, needle


def test_the_anthropic_sdk_through_the_loop(mcp_gateway: Any, scripted: Scripted, mcp: McpServers) -> None:
    import anthropic

    sdk = anthropic.Anthropic(api_key="sk-ant-sdk", base_url=mcp_gateway.url, max_retries=0)
    scripted.script(
        answers.json_answer(message(tool_use("add", {"a": 20, "b": 22}, id="toolu_sdk"))),
        answers.json_answer(message(text("The sum is 42."), model=MODEL)),
    )
    result = sdk.messages.create(
        model=MODEL,
        max_tokens=128,
        messages=[{"role": "user", "content": "add 20 and 22"}],
        tools=[{"type": "mcp_toolset", "mcp_server_name": "wx"}],  # type: ignore[list-item]
        extra_body={"mcp_servers": [{"type": "url", "name": "wx", "url": mcp.url("answer")}]},
        extra_headers={"X-SMG-MCP": "enabled"},
    )
    assert result.stop_reason == "end_turn" and result.model == MODEL
    types = [block.type for block in result.content]
    assert types == ["mcp_tool_use", "mcp_tool_result", "text"]
    assert result.content[-1].text == "The sum is 42."
    assert mcp.calls("answer") == [
        {"tool": "add", "arguments": {"a": 20, "b": 22}, "time": mcp.calls("answer")[0]["time"]}
    ]
