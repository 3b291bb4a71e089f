"""Connections to a request's MCP servers, through the official `mcp` SDK (Streamable HTTP).

Each server gets a task of its own that opens the transport and the `ClientSession`,
initializes, lists the tools, then runs the calls handed to it one at a time until it is told
to close. The SDK's anyio scopes therefore live and die inside that one task, whatever task
the loop runs in (a request handler that is cancelled, an async generator closed elsewhere);
the loop only exchanges futures with it. Every task is kept referenced and cancelled by
`close()`.

A server's `authorization_token` travels as `Authorization: Bearer <token>` and is never
logged or journaled; URLs are reported without their userinfo or query. Like the gateway's
upstream client, these connections ignore proxy settings from the environment, and each is
dialled under its server's destination policy (`smg.mcp.destinations`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from smg.fetch import DestinationPolicy, guarded_transport
from smg.protocol.errors import describe_exception

log = logging.getLogger("smg.mcp")


@dataclass(frozen=True)
class ServerSpec:
    """One `mcp_servers` entry."""

    name: str
    url: str
    token: str | None = None

    @property
    def public_url(self) -> str:
        """The URL without userinfo or query (either may carry a key), for logs and the journal."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class McpTool:
    server: str
    name: str
    description: str | None
    input_schema: dict[str, Any]


@dataclass
class ToolOutcome:
    """A call's result as the model sees it: one text, failed or not."""

    text: str
    is_error: bool
    duration_ms: float = 0.0


@dataclass
class ConnectOutcome:
    spec: ServerSpec
    ok: bool
    tools: list[McpTool] = field(default_factory=list)
    error: str | None = None
    duration_ms: float = 0.0


def result_text(result: Any) -> str:
    """The text a tool result gives the model: its text items joined by newlines; other items
    (images, resources) as JSON; structured output as JSON when there is no content at all."""
    parts: list[str] = []
    for item in getattr(result, "content", None) or []:
        if getattr(item, "type", None) == "text":
            parts.append(item.text)
        else:
            parts.append(orjson.dumps(item.model_dump(mode="json", by_alias=True, exclude_none=True)).decode())
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(orjson.dumps(result.structured_content).decode())
    return "\n".join(parts)


_Job = tuple[str, dict[str, Any], "asyncio.Future[Any]"]


class _Connection:
    """One server's session, owned by its task."""

    def __init__(
        self, spec: ServerSpec, connect_timeout: float, call_timeout: float, policy: DestinationPolicy
    ) -> None:
        self.spec = spec
        self._policy = policy
        self._connect_timeout = connect_timeout
        self._call_timeout = call_timeout
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[list[McpTool]] = loop.create_future()
        self._jobs: asyncio.Queue[_Job | None] = asyncio.Queue()
        self._current: asyncio.Future[Any] | None = None
        self.task = asyncio.create_task(self._run(), name=f"smg-mcp-{spec.name}")

    async def _run(self) -> None:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {self.spec.token}"} if self.spec.token else {}
        timeout = httpx2.Timeout(self._connect_timeout, read=self._call_timeout)
        try:
            async with (
                httpx2.AsyncClient(
                    headers=headers, timeout=timeout, trust_env=False, transport=guarded_transport(self._policy)
                ) as http,
                streamable_http_client(self.spec.url, http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=self._call_timeout) as session,
            ):
                await session.initialize()
                self.ready.set_result(await _list_tools(session, self.spec.name))
                while (job := await self._jobs.get()) is not None:
                    name, arguments, future = job
                    self._current = future
                    try:
                        result = await session.call_tool(name, arguments)
                    except Exception as exc:
                        if not future.done():
                            future.set_exception(exc)
                    else:
                        if not future.done():
                            future.set_result(result)
                    self._current = None
        except BaseException as exc:
            self._fail(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._fail(ConnectionError("MCP session closed"))

    def _fail(self, exc: BaseException) -> None:
        error = exc if isinstance(exc, Exception) else ConnectionError(describe_exception(exc))
        if not self.ready.done():
            self.ready.set_exception(error)
        for future in [self._current, *self._drain()]:
            if future is not None and not future.done():
                future.set_exception(error)

    def _drain(self) -> list[asyncio.Future[Any]]:
        out: list[asyncio.Future[Any]] = []
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            if job is not None:
                out.append(job[2])
        return out

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        if self.task.done():
            raise ConnectionError("MCP session closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait((name, arguments, future))
        return await future

    async def close(self, grace: float = 2.0) -> None:
        if not self.task.done():
            self._jobs.put_nowait(None)
            done, _ = await asyncio.wait({self.task}, timeout=grace)
            if not done:
                self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        # Nobody awaits `ready` after a failed connect: mark its exception retrieved.
        if self.ready.done() and not self.ready.cancelled():
            self.ready.exception()


async def _list_tools(session: Any, server: str) -> list[McpTool]:
    from mcp.types import PaginatedRequestParams

    tools: list[McpTool] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever is not waited on forever
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        listing = await session.list_tools(params=params)
        for tool in listing.tools:
            tools.append(McpTool(server, tool.name, tool.description, dict(tool.input_schema or {})))
        cursor = listing.next_cursor
        if not cursor:
            break
    return tools


class McpConnections:
    """A request's MCP servers: connect them all, call their tools, close them all."""

    def __init__(
        self,
        connect_timeout: float = 10.0,
        call_timeout: float = 300.0,
        policies: dict[str, DestinationPolicy] | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._call_timeout = call_timeout
        self._policies = policies or {}  # by server name; a server not named gets the default policy
        self._connections: dict[str, _Connection] = {}

    async def connect(self, specs: Sequence[ServerSpec]) -> list[ConnectOutcome]:
        """Connect to every server at once; a failure is reported, not raised."""
        unique: dict[str, ServerSpec] = {}
        for spec in specs:
            unique.setdefault(spec.name, spec)  # a name given twice: the first entry wins
        return list(await asyncio.gather(*(self._connect(spec) for spec in unique.values())))

    async def _connect(self, spec: ServerSpec) -> ConnectOutcome:
        t0 = time.perf_counter()

        def outcome(ok: bool, tools: list[McpTool] | None = None, error: str | None = None) -> ConnectOutcome:
            return ConnectOutcome(spec, ok, tools or [], error, round((time.perf_counter() - t0) * 1000, 3))

        parts = urlsplit(spec.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return outcome(False, error="the URL must be http:// or https://")
        if "/sse" in parts.path:
            return outcome(False, error="the legacy SSE transport is not supported; use a Streamable HTTP URL")
        policy = self._policies.get(spec.name, DestinationPolicy())
        connection = _Connection(spec, self._connect_timeout, self._call_timeout, policy)
        self._connections[spec.name] = connection
        try:
            tools = await asyncio.wait_for(asyncio.shield(connection.ready), self._connect_timeout)
        except Exception as exc:
            self._connections.pop(spec.name, None)
            await connection.close(grace=0)
            error = (
                f"no answer within {self._connect_timeout:g}s"
                if isinstance(exc, TimeoutError)
                else describe_exception(exc)
            )
            log.warning("MCP server %s (%s) did not connect: %s", spec.name, spec.public_url, error)
            return outcome(False, error=error)
        return outcome(True, tools)

    @property
    def connected(self) -> list[str]:
        """The servers that connected (and are not closed yet)."""
        return list(self._connections)

    async def call(self, server: str, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Run one tool; any failure (the tool's own, the session's, a timeout) is an error result."""
        t0 = time.perf_counter()
        connection = self._connections.get(server)
        try:
            if connection is None:
                raise ConnectionError(f"MCP server {server!r} is not connected")
            result = await connection.call(tool, arguments)
            outcome = ToolOutcome(result_text(result), bool(getattr(result, "is_error", False)))
        except Exception as exc:
            outcome = ToolOutcome(f"MCP tool call failed: {describe_exception(exc)}", True)
        outcome.duration_ms = round((time.perf_counter() - t0) * 1000, 3)
        return outcome

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
