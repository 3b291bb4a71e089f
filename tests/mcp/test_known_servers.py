"""`--mcp-config-path` `servers:`: the operator gives a known server its token, so clients hold
no MCP secret; the token goes only to that server's URL."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from smg.mcp.config import McpConfigError, parse_mcp_config
from tests.conftest import Scripted
from tests.mcp.conftest import FETCH_ALLOW, TOKEN, McpServers
from tests.mcp.test_loop import LOOP, body
from tools.anthropic_answers import json_answer, message, text, tool_use
from tools.spawn import Spawned, spawn_gateway


def test_tokens_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAULT_TOKEN", "t0k")
    config = parse_mcp_config(
        "servers:\n  - name: vault\n    url: https://mcp.example/mcp/\n    token: ${VAULT_TOKEN}\n"
    )
    assert config.token_for("vault", "https://mcp.example/mcp") == "t0k"
    assert config.token_for("vault", "https://elsewhere.example/mcp") is None
    assert config.token_for("other", "https://mcp.example/mcp") is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("servers:\n  - name: v\n    url: https://x\n    token: ${NOT_SET_ANYWHERE}\n", "NOT_SET_ANYWHERE"),
        ("servers:\n  - name: v\n    url: ftp://x\n", "url"),
        ("servers:\n  - url: https://x\n", "name"),
        ("servers:\n  - name: v\n    url: https://x\n    tokn: y\n", "unknown key"),
        ("servers: {v: 1}\n", "list"),
    ],
)
def test_bad_server_entries_are_refused(text: str, needle: str) -> None:
    with pytest.raises(McpConfigError, match=needle):
        parse_mcp_config(text)


@pytest.fixture(scope="module")
def operator_gateway(
    worker: Spawned, mcp_procs: dict[str, Spawned], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Spawned]:
    config = tmp_path_factory.mktemp("known") / "mcp.yaml"
    config.write_text(f"servers:\n  - name: vault\n    url: {mcp_procs['auth'].url}/mcp\n    token: ${{VAULT_TOKEN}}\n")
    proc = spawn_gateway(
        [worker.url],
        extra=["--backend", "anthropic", "--mcp-config-path", str(config), "--fetch-allow", FETCH_ALLOW],
        env={"VAULT_TOKEN": TOKEN},
    )
    try:
        yield proc
    finally:
        proc.stop()


def test_a_request_without_a_token_uses_the_operators(
    operator_gateway: Spawned, scripted: Scripted, mcp: McpServers
) -> None:
    servers = [{"type": "url", "name": "vault", "url": mcp.url("auth")}]
    scripted.script(json_answer(message(tool_use("whoami", {}, id="toolu_w"))), json_answer(message(text("ok"))))
    response = httpx.post(
        operator_gateway.url + "/v1/messages", json=body(mcp, servers=servers), headers=LOOP, timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.json()["content"][1]["content"][0]["text"] == "an authorized caller"
    assert set(mcp.authorization("auth")) == {f"Bearer {TOKEN}"}


def test_the_token_is_never_sent_to_another_url(operator_gateway: Spawned, scripted: Scripted, mcp: McpServers) -> None:
    elsewhere = [{"type": "url", "name": "vault", "url": mcp.url("answer")}]  # same name, other URL
    scripted.script(json_answer(message(text("no tools needed"))))
    response = httpx.post(
        operator_gateway.url + "/v1/messages", json=body(mcp, servers=elsewhere), headers=LOOP, timeout=30
    )
    assert response.status_code == 200
    assert f"Bearer {TOKEN}" not in set(mcp.authorization("answer"))
