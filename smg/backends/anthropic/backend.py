"""`--backend anthropic`: the gateway in front of the Anthropic API itself.

Each worker URL is an API origin (serving any model under `--backend anthropic`); requests go to
`<url>/v1/messages` with exactly the client's credentials (`headers.py`). A stream is relayed as
it arrives; a non-streaming success is parsed into the gateway's Message model and
re-serialized, the upstream's own bytes journaled as an `original` part beside the `body` the
client gets; an error keeps its status and is re-shaped by the projection; a stream ends with
the API's `error` event when one comes. count_tokens is 501; `GET /v1/models` is the API's
own answer to the caller's key (`list_models`).
A request with `X-SMG-MCP: enabled` and an `mcp_toolset` runs the MCP tool loop instead.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

import httpx

from journal.events import Event, Upstream
from journal.pieces import text_piece
from smg.backends.anthropic.headers import DEFAULT_VERSION, upstream_headers
from smg.backends.anthropic.sse import ErrorFrameWatch
from smg.backends.anthropic.upstream import AnthropicModel, open_response, read_body, send_failure
from smg.backends.base import Attempts, Call, Discovery, Failure, Target, WorkerUnreachable
from smg.backends.http.client import make_client
from smg.backends.http.discovery import parse_model_list, probe_failure
from smg.backends.http.headers import relayed_response_headers
from smg.backends.http.relay import relay_body
from smg.backends.upstream import stream_parts
from smg.config import GatewayConfig
from smg.mcp import LoopRequest, McpConfig, load_mcp_config, run_loop, wants_loop
from smg.protocol import codec
from smg.protocol.errors import ApiError
from smg.protocol.response import reserialized_message

log = logging.getLogger("smg.anthropic")

MESSAGES_PATH = "/v1/messages"
MODELS_PATH = "/v1/models"
_ERROR_BODY_LIMIT = 1 << 20


def reserialize(raw: bytes) -> bytes:
    """A success body parsed into the Message model and written back out; 502 `parse_error`
    when it does not parse."""
    try:
        return codec.dumps(reserialized_message(raw))
    except ApiError:
        log.warning("unparseable response from the Anthropic API (%d bytes)", len(raw))
        raise


class AnthropicConnector:
    """Forwards Messages requests to the Anthropic API."""

    name = "anthropic"
    generates = False

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._client: httpx.AsyncClient | None = None
        self.mcp: McpConfig = load_mcp_config(Path(config.mcp_config_path) if config.mcp_config_path else None)
        self._fetch_policy = config.fetch.policy()  # where a request's MCP server URLs may lead

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("connector not started")
        return self._client

    async def start(self) -> None:
        # make_client adds no header of its own: the API sees only the client's forwarded ones.
        if self._client is None:
            self._client = make_client(
                self._config.upstream_transport, self._config.request_timeout_secs, self._config.instance_id
            )

    async def close(self) -> None:
        if self._client:
            await self._client.aclose()
            self._client = None

    async def discover(self, target: Target) -> Discovery:
        """The models the worker's own key may use; without a key, nothing to ask (the API
        serves whatever the caller's key may use)."""
        if not target.api_key:
            return Discovery(models={})
        headers = {"x-api-key": target.api_key, "anthropic-version": DEFAULT_VERSION}
        try:
            response = await self.client.get(target.url + MODELS_PATH, headers=headers, timeout=10.0)
            response.raise_for_status()
            return Discovery(models=parse_model_list(response.json()))
        except (httpx.HTTPError, ValueError) as exc:
            raise WorkerUnreachable(probe_failure(exc)) from None

    async def check_health(self, target: Target, timeout: float, endpoint: str) -> bool:
        return True  # an API origin has no health endpoint; failed requests open its breaker

    async def forget(self, target: Target) -> None:
        return None

    async def load(self, target: Target) -> int | None:
        return None

    def ready(self, targets: Sequence[Target]) -> bool:
        return self._client is not None

    async def list_models(
        self, target: Target, headers: Mapping[str, str], query: str, model_id: str | None = None
    ) -> tuple[int, bytes]:
        """`GET /v1/models[/{id}]` answered by the API itself, with the caller's own credentials."""
        path = MODELS_PATH + (f"/{quote(model_id, safe='')}" if model_id is not None else "")
        url = target.url + path + (f"?{query}" if query else "")
        try:
            sent = upstream_headers(
                headers, content_type=False, gateway_key=self._config.api_key, instance_id=self._config.instance_id
            )
            response = await self.client.get(url, headers=sent)
        except httpx.HTTPError as exc:
            raise send_failure(exc) from None
        return response.status_code, response.content

    async def handle(self, call: Call, pool: Sequence[Target], attempts: Attempts) -> AsyncGenerator[Event, None]:
        if call.endpoint == "count_tokens":
            raise ApiError(501, "count_tokens is not implemented for the Anthropic API backend", code="not_implemented")
        headers = upstream_headers(call.headers, gateway_key=self._config.api_key, instance_id=self._config.instance_id)
        async for lease in attempts:
            worker = lease.target
            yield lease.routed
            url = worker.url + MESSAGES_PATH
            if wants_loop(call.headers, call.request):
                model = AnthropicModel(self.client, url, headers, self._config.max_payload_size)
                request = LoopRequest(body=call.body, request=call.request, model=call.model, stream=call.stream)
                async for event in run_loop(request, model, self.mcp, self._fetch_policy):
                    yield event
                lease.answered(200)
                return
            try:
                response = await open_response(self.client, url, relay_body(call), headers)
            except ApiError as err:
                # The reference's Anthropic backend has no retry executor: the failure is the answer.
                lease.failed(Failure("timeout" if err.status == 504 else "transport", err, retryable=False))
                continue
            lease.answered(response.status_code if response.status_code < 500 else 500)
            try:
                async for event in self._relay(call, worker, response):
                    yield event
            finally:
                await response.aclose()
            return

    async def _relay(self, call: Call, worker: Target, response: httpx.Response) -> AsyncIterator[Event]:
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
            # The API sends no message_stop after an `error` event: the stream ends with that frame.
            watch = ErrorFrameWatch()
            async for event in stream_parts(response):
                if isinstance(event, Upstream) and event.encoding == "utf-8" and event.data:
                    end = watch.feed(event.data)
                    if end is not None:
                        event.data = event.data[:end]
                        yield event
                        return
                yield event
            return
        # Non-streaming success: upstream headers are not copied; the body is re-serialized.
        yield Upstream(part="head", status=200, headers={"content-type": "application/json"}, worker=worker.url)
        raw = await read_body(response, self._config.max_payload_size)
        data, encoding = text_piece(raw)
        yield Upstream(part="original", status=status, data=data, encoding=encoding)
        yield Upstream(part="body", data=reserialize(raw).decode("utf-8"))
