"""`--backend anthropic`: the gateway in front of the Anthropic API itself.

Each worker URL is an API origin serving any model (a wildcard worker); requests go to
`<url>/v1/messages` with exactly the client's credentials (`headers.py`). A stream is relayed as
it arrives; a non-streaming success is parsed into the gateway's Message model and
re-serialized, the upstream's own bytes journaled as an `original` part beside the `body` the
client gets; an error keeps its status and is re-shaped by the projection. count_tokens is 501.
A request with `X-SMG-MCP: enabled` and an `mcp_toolset` runs the MCP tool loop instead.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import httpx

from journal.events import Event, Routed, Upstream
from journal.pieces import text_piece
from smg.backends.anthropic.headers import upstream_headers
from smg.backends.anthropic.upstream import AnthropicModel, open_response, read_body
from smg.backends.base import Call, ModelCard
from smg.backends.http.client import make_client
from smg.backends.http.headers import relayed_response_headers
from smg.backends.http.relay import relay_body
from smg.backends.upstream import stream_parts
from smg.config import GatewayConfig
from smg.mcp import LoopRequest, McpConfig, load_mcp_config, run_loop, wants_loop
from smg.protocol import codec
from smg.protocol.errors import ApiError
from smg.protocol.response import reserialized_message
from smg.routing.workers import Worker, WorkerRegistry

log = logging.getLogger("smg.anthropic")

MESSAGES_PATH = "/v1/messages"
_ERROR_BODY_LIMIT = 1 << 20


def reserialize(raw: bytes) -> bytes:
    """A success body parsed into the Message model and written back out; 502 `parse_error`
    when it does not parse."""
    try:
        return codec.dumps(reserialized_message(raw))
    except ApiError:
        log.warning("unparseable response from the Anthropic API (%d bytes)", len(raw))
        raise


class AnthropicBackend:
    """Forwards Messages requests to the Anthropic API (any model, wildcard workers)."""

    name = "anthropic"

    def __init__(self, config: GatewayConfig, registry: WorkerRegistry, urls: list[str]) -> None:
        self._config = config
        self._registry = registry
        self._urls = [u.rstrip("/") for u in urls]
        self._client: httpx.AsyncClient | None = None
        self.mcp: McpConfig = load_mcp_config(Path(config.mcp_config_path) if config.mcp_config_path else None)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("backend not started")
        return self._client

    async def start(self) -> None:
        # make_client adds no header of its own: the API sees only the client's forwarded ones.
        self._client = make_client(self._config.upstream_transport, self._config.request_timeout_secs)
        for url in self._urls:
            self._registry.add(Worker(url=url, kind="anthropic", wildcard=True, healthy=True, discovered=True))

    async def close(self) -> None:
        if self._client:
            await self._client.aclose()

    def models(self) -> list[ModelCard]:
        # The API serves whatever models the caller's key may use: nothing to list up front.
        return []

    def ready(self) -> bool:
        return self._client is not None

    async def handle(self, call: Call) -> AsyncGenerator[Event, None]:
        if call.endpoint == "count_tokens":
            raise ApiError(501, "count_tokens is not implemented for the Anthropic API backend", code="not_implemented")
        worker = self._registry.select(call.model)
        yield Routed(backend=self.name, worker=worker.url, model=call.model, policy="round_robin")
        url = worker.url + MESSAGES_PATH
        headers = upstream_headers(call.headers)
        if wants_loop(call.headers, call.request):
            model = AnthropicModel(self.client, url, headers, self._config.max_payload_size)
            request = LoopRequest(body=call.body, request=call.request, model=call.model, stream=call.stream)
            async for event in run_loop(request, model, self.mcp):
                yield event
            return
        response = await open_response(self.client, url, relay_body(call), headers)
        try:
            async for event in self._relay(call, worker, response):
                yield event
        finally:
            await response.aclose()

    async def _relay(self, call: Call, worker: Worker, response: httpx.Response) -> AsyncIterator[Event]:
        status = response.status_code
        if status >= 400:
            # The projection re-shapes it: an Anthropic-shaped body keeps its error, gains our request_id.
            head = relayed_response_headers(response.headers.multi_items())
            yield Upstream(part="head", status=status, headers=head, worker=worker.url)
            raw = await read_body(response, _ERROR_BODY_LIMIT)
            data, encoding = text_piece(raw)
            yield Upstream(part="body", data=data, encoding=encoding)
            return
        if call.stream:
            head = relayed_response_headers(response.headers.multi_items())
            head["content-type"] = "text/event-stream"
            head["cache-control"] = "no-cache"
            yield Upstream(part="head", status=status, headers=head, worker=worker.url)
            async for event in stream_parts(response):
                yield event
            return
        # Non-streaming success: upstream headers are not copied; the body is re-serialized.
        yield Upstream(part="head", status=200, headers={"content-type": "application/json"}, worker=worker.url)
        raw = await read_body(response, self._config.max_payload_size)
        data, encoding = text_piece(raw)
        yield Upstream(part="original", status=status, data=data, encoding=encoding)
        yield Upstream(part="body", data=reserialize(raw).decode("utf-8"))
