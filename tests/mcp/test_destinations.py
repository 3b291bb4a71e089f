"""`mcp_servers[].url` under the fetch policy: a server on a refused destination is refused with
400 `mcp_server_url_refused` before any server is dialled; a server the MCP config lists is
dialled wherever it is; `--fetch-allow` opens a range (the rest of tests/mcp runs with it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Scripted, wait_for_events
from tests.mcp.conftest import McpServers
from tests.mcp.test_loop import LOOP, body
from tools.anthropic_answers import json_answer, message, text
from tools.spawn import Spawned, spawn_gateway


@pytest.fixture(scope="module")
def guarded(
    worker: Spawned, mcp_procs: dict[str, Spawned], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Spawned, Path]]:
    """A gateway without --fetch-allow, whose MCP config lists the `answer` server."""
    root = tmp_path_factory.mktemp("destinations")
    config = root / "mcp.yaml"
    config.write_text(f"servers:\n  - name: listed\n    url: {mcp_procs['answer'].url}/mcp\n")
    journal = root / "journal.db"
    extra = ["--backend", "anthropic", "--mcp-config-path", str(config)]
    proc = spawn_gateway([worker.url], journal=journal, extra=extra)
    try:
        yield proc, journal
    finally:
        proc.stop()


def post(gateway: Spawned, payload: dict) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/messages", json=payload, headers=LOOP, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_a_server_on_a_refused_destination_is_refused_before_any_connect(
    guarded: tuple[Spawned, Path], scripted: Scripted, mcp: McpServers, stream: bool
) -> None:
    gateway, journal = guarded
    servers = [
        {"type": "url", "name": "wx", "url": mcp.url("answer")},  # the listed server: would connect
        {"type": "url", "name": "tools", "url": mcp.url("fail")},
    ]
    response = post(gateway, body(mcp, servers=servers, stream=stream))
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-smg-error-code"] == "mcp_server_url_refused"
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": "MCP server 'tools' URL refused: destination 127.0.0.1 is a loopback address; allow it with "
        "--fetch-allow, or list the server under `servers:` in the MCP config",
    }
    assert mcp.authorization("fail") == [] and mcp.authorization("answer") == []  # no server was dialled
    assert scripted.received() == []
    events = wait_for_events(journal, response.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]
    assert not any(e.kind == "mcp_connect" for e in events)


@pytest.mark.parametrize(
    ("spelling", "rule"),
    [
        ("2130706433", "loopback address"),
        ("[::ffff:127.0.0.1]", "loopback address"),
        ("localhost", "localhost resolves to a loopback address"),
    ],
)
def test_every_spelling_of_a_refused_destination_is_refused(
    guarded: tuple[Spawned, Path], mcp: McpServers, spelling: str, rule: str
) -> None:
    url = mcp.url("fail").replace("127.0.0.1", spelling)
    response = post(guarded[0], body(mcp, servers=[{"type": "url", "name": "tools", "url": url}]))
    assert response.status_code == 400 and rule in response.json()["error"]["message"]
    assert mcp.authorization("fail") == []


def test_a_server_url_with_credentials_is_refused(guarded: tuple[Spawned, Path], mcp: McpServers) -> None:
    url = mcp.url("answer").replace("http://", "http://user:pw@")  # the listed server, but with userinfo
    response = post(guarded[0], body(mcp, servers=[{"type": "url", "name": "tools", "url": url}]))
    assert response.status_code == 400 and response.headers["x-smg-error-code"] == "mcp_server_url_refused"
    assert "credentials" in response.json()["error"]["message"] and "pw" not in response.json()["error"]["message"]
    assert mcp.authorization("answer") == []


def test_a_server_the_config_lists_is_dialled_on_loopback(
    guarded: tuple[Spawned, Path], scripted: Scripted, mcp: McpServers
) -> None:
    scripted.script(json_answer(message(text("no tools needed"))))
    response = post(guarded[0], body(mcp, servers=[{"type": "url", "name": "wx", "url": mcp.url("answer")}]))
    assert response.status_code == 200, response.text
    (sent,) = scripted.received()
    assert [t["name"] for t in sent["json"]["tools"]] == ["get_weather", "add", "echo", "lookup"]
    assert mcp.authorization("answer") != []
