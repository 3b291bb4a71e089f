"""`smg_mcp_tool_calls_total` and `smg_mcp_tool_duration_seconds` after a loop that runs one tool
that answers and one that fails, scraped from the gateway's metrics listener."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import Scripted
from tests.mcp.conftest import FETCH_ALLOW, POLICY, McpServers
from tests.observability.test_metrics_live import scrape
from tools import anthropic_answers as answers
from tools.anthropic_answers import message, text, tool_use
from tools.spawn import Spawned, free_port, spawn_gateway

MODEL = "claude-sonnet-4-20250514"
LOOP = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01", "X-SMG-MCP": "enabled"}


def test_tool_calls_are_counted_by_model_tool_and_result(
    worker: Spawned, scripted: Scripted, mcp: McpServers, tmp_path: Path
) -> None:
    policy = tmp_path / "mcp.yaml"
    policy.write_text(POLICY)
    port = free_port()
    gw = spawn_gateway(
        [worker.url],
        extra=["--backend", "anthropic", "--mcp-config-path", str(policy), "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(port), "--fetch-allow", FETCH_ALLOW],
    )  # fmt: skip
    try:
        turn = message(
            tool_use("get_weather", {"city": "Paris"}, id="toolu_01"),
            tool_use("explode", {"reason": "no"}, id="toolu_02"),
            usage=(20, 10),
        )
        scripted.script(answers.json_answer(turn), answers.json_answer(message(text("Done."), usage=(40, 5))))
        servers = [
            {"type": "url", "name": "wx", "url": mcp.url("answer")},
            {"type": "url", "name": "boom", "url": mcp.url("fail")},
        ]
        body = {
            "model": MODEL,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "weather?"}],
            "mcp_servers": servers,
            "tools": [{"type": "mcp_toolset", "mcp_server_name": s["name"]} for s in servers],
        }
        response = httpx.post(f"{gw.url}/v1/messages", json=body, headers=LOOP, timeout=30.0)
        assert response.status_code == 200, response.text
        m = scrape(port)
    finally:
        gw.stop()
    assert m.value("smg_mcp_tool_calls_total", model=MODEL, tool_name="get_weather", result="success") == 1
    assert m.value("smg_mcp_tool_calls_total", model=MODEL, tool_name="explode", result="error") == 1
    assert m.value("smg_mcp_tool_duration_seconds_count", model=MODEL, tool_name="get_weather") == 1
    assert m.value("smg_router_requests_total", router_type="http", backend_type="external", connection_mode="http",
                   model=MODEL, endpoint="messages", streaming="false") == 1  # fmt: skip
