"""Real MCP servers (`tools.mcp_servers`: one that answers, one whose tools fail, one that wants
a bearer token) and a `--backend anthropic` gateway with an MCP policy file, all as processes on
loopback ports, in front of the suite's scripted worker as the Anthropic upstream."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.spawn import Spawned, free_port, spawn, spawn_gateway

TOKEN = "s3cret-mcp-token"
FETCH_ALLOW = "127.0.0.1/32"  # the MCP servers listen on loopback, which the fetch policy refuses
POLICY = """\
# The gateway may not run `echo` on the server the requests call `wx`.
policy:
  default: allow
  servers:
    wx:
      tools:
        echo: deny
"""


def _spawn_mcp(kind: str) -> Spawned:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "tools.mcp_servers", "--kind", kind, "--port", str(port), "--token", TOKEN]
    return spawn(args, ready_url=f"{url}/health", url=url)


class McpServers:
    """The test's handle on the three servers."""

    def __init__(self, procs: dict[str, Spawned]) -> None:
        self.procs = procs

    def url(self, kind: str) -> str:
        return f"{self.procs[kind].url}/mcp"

    def calls(self, kind: str) -> list[dict[str, Any]]:
        return httpx.get(f"{self.procs[kind].url}/_calls").json()["calls"]

    def authorization(self, kind: str) -> list[str | None]:
        return httpx.get(f"{self.procs[kind].url}/_calls").json()["authorization"]

    def reset(self) -> None:
        for proc in self.procs.values():
            httpx.post(f"{proc.url}/_reset").raise_for_status()


@pytest.fixture(scope="session")
def mcp_procs() -> Iterator[dict[str, Spawned]]:
    kinds = ("answer", "fail", "auth")
    with ThreadPoolExecutor(len(kinds)) as pool:
        futures = {kind: pool.submit(_spawn_mcp, kind) for kind in kinds}
    procs: dict[str, Spawned] = {}
    try:
        for kind, future in futures.items():
            procs[kind] = future.result()
        yield procs
    finally:
        for future in futures.values():
            if future.exception() is None:
                future.result().stop()


@pytest.fixture
def mcp(mcp_procs: dict[str, Spawned]) -> McpServers:
    servers = McpServers(mcp_procs)
    servers.reset()
    return servers


@pytest.fixture(scope="session")
def mcp_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "journal.db"


@pytest.fixture(scope="session")
def mcp_gateway(worker: Spawned, mcp_journal: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    policy = tmp_path_factory.mktemp("mcp-config") / "mcp.yaml"
    policy.write_text(POLICY)
    proc = spawn_gateway(
        [worker.url],
        journal=mcp_journal,
        extra=["--backend", "anthropic", "--mcp-config-path", str(policy), "--fetch-allow", FETCH_ALLOW],
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def gw(mcp_gateway: Spawned) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=mcp_gateway.url, timeout=30.0) as http:
        yield http
