"""The MCP tool loop (behaviors.md I.3–I.5): the gateway runs the tools a model calls.

Connect to every `mcp_servers` entry (none connecting is 502 `mcp_connection_failed`, before
any stream), expose the enabled tools, then call the model; while it answers with tool calls
and `stop_reason: tool_use`, run them one after another (the policy may deny one: the model is
told), send the results back and call again, for at most `MAX_ROUNDS` rounds of tool calls.
Every `tool_use` of a round goes through the loop, as in the reference gateway: one naming a
tool no connected server provides (a client tool kept beside the toolsets) gets an error
result and an empty `server_name`, so mixing client tools with a gateway-run loop is not
supported.

Everything is a journal event: `mcp_connect` per server, then per round `model_call`,
`model_result` and an `mcp_call`/`mcp_result` pair per tool call. What the client gets is
`block` events: a stream's are its SSE events (it starts with `stream_opened`, before the
first model call, so that any failure after that is an SSE `error` event); a buffered answer's
fold into the message, which is the last model response with every earlier round's blocks in
front of its content, each `tool_use` replaced by its `mcp_tool_use` + `mcp_tool_result` pair.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from journal.events import (
    Block,
    Error,
    Event,
    McpCall,
    McpConnect,
    McpResult,
    ModelCall,
    ModelResult,
    StreamOpened,
)
from journal.pieces import text_piece
from smg.fetch import DestinationPolicy
from smg.mcp.blocks import assistant_input, mcp_id, mcp_tool_result, mcp_tool_use, tool_result
from smg.mcp.client import McpConnections, ToolOutcome
from smg.mcp.config import McpConfig
from smg.mcp.destinations import server_policies
from smg.mcp.model import ModelClient, ModelStreamError
from smg.mcp.streaming import StreamRewriteError, StreamRewriter
from smg.mcp.toolset import exposed_tools, rewrite_request, server_specs, toolsets
from smg.protocol.errors import ApiError, error_from_upstream
from smg.protocol.request import CreateMessageRequest
from smg.protocol.response import reserialized_message
from smg.protocol.tools import McpToolset

MAX_ROUNDS = 10
HEADER = "x-smg-mcp"

CONNECTION_FAILED = "Failed to connect to MCP servers. Check server URLs and authorization."
MAX_ITERATIONS = f"MCP tool loop exceeded maximum iterations ({MAX_ROUNDS})"


def wants_loop(headers: Mapping[str, str], request: Any) -> bool:
    """`X-SMG-MCP: enabled` (any case) and at least one `mcp_toolset` tool."""
    value = next((v for k, v in headers.items() if k.lower() == HEADER), None)
    if value is None or value.strip().lower() != "enabled":
        return False
    return any(isinstance(t, McpToolset) for t in getattr(request, "tools", None) or ())


@dataclass
class LoopRequest:
    body: dict[str, Any]  # the client's JSON, as sent
    request: CreateMessageRequest  # the same, parsed
    model: str  # canonical model id
    stream: bool


@dataclass
class _Call:
    """One tool call of a round, once run."""

    tool_use: dict[str, Any]
    server: str
    outcome: ToolOutcome


async def run_loop(
    req: LoopRequest, model: ModelClient, config: McpConfig, policy: DestinationPolicy | None = None
) -> AsyncIterator[Event]:
    """The loop's events. Raises `ApiError` for a failure before anything was sent (a server
    URL that `policy`, the gateway's fetch policy, refuses: before any server is dialled)."""
    specs = server_specs(req.request, config)
    policies = await server_policies(specs, config, policy or DestinationPolicy())
    connections = McpConnections(config.connect_timeout_secs, config.call_timeout_secs, policies)
    try:
        outcomes = await connections.connect(specs)
        for o in outcomes:
            yield McpConnect(
                server=o.spec.name,
                url=o.spec.public_url,
                ok=o.ok,
                tools=[t.name for t in o.tools],
                error=o.error,
                duration_ms=o.duration_ms,
            )
        if not connections.connected:
            raise ApiError(502, CONNECTION_FAILED, code="mcp_connection_failed")
        listed = {o.spec.name: o.tools for o in outcomes if o.ok}
        tools, owners = exposed_tools(toolsets(req.request), listed)
        body = rewrite_request(req.body, req.model, tools)
        loop = _Loop(connections, config, owners, [t["name"] for t in body.get("tools", [])])
        events = loop.streaming(model, body) if req.stream else loop.buffered(model, body)
        async for event in events:
            yield event
    finally:
        await connections.close()


def _elapsed_ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


class _Loop:
    def __init__(self, connections: McpConnections, config: McpConfig, owners: dict[str, str], tools: list[str]):
        self._connections = connections
        self._config = config
        self._owners = owners
        self._tool_names = tools

    # -- both modes ---------------------------------------------------------------------

    def _model_call(self, round_no: int, stream: bool, body: dict[str, Any], added: list[dict[str, Any]]) -> ModelCall:
        return ModelCall(
            round=round_no,
            stream=stream,
            tools=self._tool_names,
            request=body if round_no == 1 else None,
            added=[] if round_no == 1 else added,
        )

    async def _run_tools(
        self, round_no: int, tool_uses: list[dict[str, Any]], done: list[_Call]
    ) -> AsyncIterator[Event]:
        """Run a round's calls one after another; each finished call is appended to `done`
        before its `mcp_result` event is yielded."""
        for tool_use in tool_uses:
            name = str(tool_use.get("name"))
            server = self._owners.get(name)
            allowed = server is not None and self._config.allows(server, name)
            arguments = tool_use.get("input")
            yield McpCall(
                round=round_no, server=server, tool=name, id=mcp_id(str(tool_use.get("id"))),
                input=arguments, allowed=allowed,
            )  # fmt: skip
            if server is None:
                outcome = ToolOutcome(f"Tool '{name}' is not provided by any connected MCP server", True)
            elif not allowed:
                outcome = ToolOutcome(f"Tool '{name}' of MCP server '{server}' is denied by the gateway's policy", True)
            else:
                outcome = await self._connections.call(server, name, arguments if isinstance(arguments, dict) else {})
            done.append(_Call(tool_use, server or "", outcome))
            yield McpResult(
                round=round_no, server=server, tool=name, id=mcp_id(str(tool_use.get("id"))),
                is_error=outcome.is_error, content=outcome.text, duration_ms=outcome.duration_ms,
            )  # fmt: skip

    @staticmethod
    def _next_turn(content: list[dict[str, Any]], calls: list[_Call]) -> list[dict[str, Any]]:
        return [
            {"role": "assistant", "content": assistant_input(content)},
            {
                "role": "user",
                "content": [tool_result(c.tool_use["id"], c.outcome.text, c.outcome.is_error) for c in calls],
            },
        ]

    # -- non-streaming --------------------------------------------------------------------

    async def buffered(self, model: ModelClient, body: dict[str, Any]) -> AsyncIterator[Event]:
        body = {k: v for k, v in body.items() if k != "stream"}
        messages: list[Any] = list(body.get("messages") or [])
        content: list[dict[str, Any]] = []
        added: list[dict[str, Any]] = []
        for round_no in range(1, MAX_ROUNDS + 2):
            sent = {**body, "messages": messages}
            yield self._model_call(round_no, False, sent, added)
            t0 = time.perf_counter()
            reply = await model.create(sent)
            data, encoding = text_piece(reply.body)
            result = ModelResult(
                round=round_no, status=reply.status, duration_ms=_elapsed_ms(t0), data=data, encoding=encoding
            )
            if reply.status >= 400:
                yield result
                raise error_from_upstream(reply.status, reply.body, reply.headers)
            try:
                message = reserialized_message(reply.body)
            except ApiError:
                yield result
                raise
            tool_uses = [b for b in message["content"] if b.get("type") == "tool_use"]
            result.stop_reason = message.get("stop_reason")
            result.usage = message.get("usage")
            result.tool_uses = [str(b.get("name")) for b in tool_uses]
            yield result
            if not tool_uses:
                break
            _check_stop_reason(len(tool_uses), message.get("stop_reason"))
            if round_no > MAX_ROUNDS:
                raise ApiError(502, MAX_ITERATIONS, code="mcp_max_iterations")
            calls: list[_Call] = []
            async for event in self._run_tools(round_no, tool_uses, calls):
                yield event
            by_id = {id(c.tool_use): c for c in calls}
            for block in message["content"]:
                call = by_id.get(id(block))
                if call is None:
                    content.append(block)
                else:
                    content.append(mcp_tool_use(block, call.server))
                    content.append(mcp_tool_result(block["id"], call.outcome.text, call.outcome.is_error))
            added = self._next_turn(message["content"], calls)
            messages.extend(added)
        content.extend(message["content"])
        for payload in _message_events(message, content):
            yield Block(event=payload)

    # -- streaming --------------------------------------------------------------------------

    async def streaming(self, model: ModelClient, body: dict[str, Any]) -> AsyncIterator[Event]:
        yield StreamOpened()
        body = {**body, "stream": True}
        messages: list[Any] = list(body.get("messages") or [])
        rewriter = StreamRewriter(self._owners)
        added: list[dict[str, Any]] = []
        for round_no in range(1, MAX_ROUNDS + 1):
            sent = {**body, "messages": messages}
            yield self._model_call(round_no, True, sent, added)
            t0 = time.perf_counter()
            rewriter.begin_round()
            failure: Error | None = None
            try:
                async with model.stream(sent) as upstream:
                    try:
                        if upstream.status >= 400:
                            raw = await upstream.read()
                            err = error_from_upstream(upstream.status, raw, upstream.headers)
                            failure = _stream_error(f"Worker returned error status: {upstream.status}: {err.message}")
                        else:
                            async for payload in upstream.events():
                                for out in rewriter.feed(payload):
                                    if out.get("type") == "error":
                                        failure = _upstream_error_event(out)
                                        break
                                    yield Block(event=out)
                                if failure is not None:
                                    break
                    except (ModelStreamError, StreamRewriteError) as exc:
                        failure = _stream_error(str(exc))
                    except ApiError as err:  # reading an error answer failed
                        failure = _stream_error(f"Stream read error: {err.message}")
                    yield self._model_result(round_no, t0, upstream.status, upstream.received(), rewriter)
            except ApiError as err:  # the request did not go out (timeout, connection)
                failure = _stream_error(f"Failed to send request to worker ({err.code}): {err.message}")
            if failure is None and not rewriter.current.complete:
                failure = _stream_error("Upstream stream ended before message_stop")
            if failure is not None:
                yield failure
                return
            current = rewriter.current
            tool_uses = current.tool_uses()
            if not tool_uses:
                for payload in rewriter.finish():
                    yield Block(event=payload)
                return
            try:
                _check_stop_reason(len(tool_uses), current.stop_reason)
            except ApiError as err:
                yield _stream_error(err.message, err.code)
                return
            calls: list[_Call] = []
            async for event in self._run_tools(round_no, tool_uses, calls):
                yield event
                if isinstance(event, McpResult):
                    last = calls[-1]
                    for payload in rewriter.tool_result(last.tool_use["id"], last.outcome.text, last.outcome.is_error):
                        yield Block(event=payload)
            added = self._next_turn(current.fold.content(), calls)
            messages.extend(added)
        yield _stream_error(MAX_ITERATIONS, "mcp_max_iterations")

    @staticmethod
    def _model_result(round_no: int, t0: float, status: int, raw: bytes, rewriter: StreamRewriter) -> ModelResult:
        data, encoding = text_piece(raw)
        current = rewriter.current
        return ModelResult(
            round=round_no,
            status=status,
            duration_ms=_elapsed_ms(t0),
            stop_reason=current.stop_reason,
            usage=current.usage if status < 400 else None,
            tool_uses=[str(b.get("name")) for b in current.tool_uses()],
            data=data,
            encoding=encoding,
        )


def _check_stop_reason(count: int, stop_reason: Any) -> None:
    if stop_reason != "tool_use":
        raise ApiError(
            502,
            f"Model returned {count} tool_use block(s) but stop_reason is {stop_reason}; "
            "tool calls will not be executed",
            code="mcp_tool_loop_error",
        )


def _stream_error(message: str, code: str | None = None) -> Error:
    """A failure after the stream started: an SSE `error` event of type `api_error`."""
    return Error(stage="mcp", status=502, error_type="api_error", message=message, code=code)


def _upstream_error_event(payload: dict[str, Any]) -> Error:
    error = payload.get("error") or {}
    return Error(
        stage="upstream",
        status=502,
        error_type=str(error.get("type") or "api_error"),
        message=str(error.get("message") or "Upstream stream error"),
    )


def _message_events(last: dict[str, Any], content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A buffered answer as the stream events the projection folds into one message."""
    start = dict(last, content=[], stop_reason=None, stop_sequence=None)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(content):
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_stop", "index": index})
    delta = {"stop_reason": last.get("stop_reason"), "stop_sequence": last.get("stop_sequence")}
    events.append({"type": "message_delta", "delta": delta, "usage": last.get("usage")})
    events.append({"type": "message_stop"})
    return events
