"""One call to the Anthropic API: send, map transport failures to the documented codes, read.

Send failures (behaviors.md H): a timeout is 504 `timeout`, a refused or failed connection 502
`connection_failed`, anything else 502 `request_failed`. `AnthropicModel` is the same call seen
through the MCP loop's `ModelClient` interface.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from smg.backends.anthropic.sse import SseDecoder, SseError
from smg.backends.upstream import BodyTooLarge, read_capped
from smg.mcp.model import ModelReply, ModelStreamError
from smg.protocol import codec
from smg.protocol.errors import ApiError, describe_upstream_failure

MAX_ERROR_BODY = 1 << 20


def send_failure(exc: httpx.HTTPError) -> ApiError:
    """The gateway's answer when a request to the Anthropic API fails in transport."""
    if isinstance(exc, httpx.TimeoutException):
        return ApiError(504, f"Request timeout: {describe_upstream_failure(exc)}", code="timeout")
    if isinstance(exc, httpx.ConnectError):
        return ApiError(502, f"Connection failed: {describe_upstream_failure(exc)}", code="connection_failed")
    return ApiError(502, f"Request failed: {describe_upstream_failure(exc)}", code="request_failed")


async def open_response(client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    """POST and return once the head arrived (the body is still to be read). Raises `ApiError`."""
    request = client.build_request("POST", url, content=body, headers=headers)
    try:
        return await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise send_failure(exc) from None


async def read_body(response: httpx.Response, limit: int) -> bytes:
    """The whole body, at most `limit` bytes. Raises `ApiError` (a transport failure or a body
    too large to be an answer)."""
    try:
        return await read_capped(response, limit)
    except BodyTooLarge:
        raise ApiError(502, f"Response from backend larger than {limit} bytes", code="parse_error") from None
    except httpx.HTTPError as exc:
        raise send_failure(exc) from None


class _Stream:
    """A streamed answer for the MCP loop: head known, events decoded as bytes arrive."""

    def __init__(self, response: httpx.Response, limit: int) -> None:
        self.status = response.status_code
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        self._response = response
        self._limit = limit
        self._received: list[bytes] = []

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        decoder = SseDecoder()
        try:
            async for chunk in self._response.aiter_bytes():
                self._received.append(chunk)
                for payload in decoder.feed(chunk):
                    yield payload
            for payload in decoder.flush():
                yield payload
        except httpx.HTTPError as exc:
            raise ModelStreamError(f"Stream read error: {describe_upstream_failure(exc)}") from None
        except SseError as exc:
            raise ModelStreamError(f"Failed to parse SSE data: {exc}") from None

    async def read(self) -> bytes:
        body = await read_body(self._response, self._limit)
        self._received.append(body)
        return body

    def received(self) -> bytes:
        return b"".join(self._received)


class AnthropicModel:
    """The MCP loop's `ModelClient`: one worker, the client's forwarded headers."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str], limit: int) -> None:
        self._client = client
        self._url = url
        self._headers = headers
        self._limit = limit

    async def create(self, body: dict[str, Any]) -> ModelReply:
        response = await open_response(self._client, self._url, codec.dumps(body), self._headers)
        try:
            raw = await read_body(response, self._limit if response.status_code < 400 else MAX_ERROR_BODY)
        finally:
            await response.aclose()
        return ModelReply(response.status_code, {k.lower(): v for k, v in response.headers.items()}, raw)

    @asynccontextmanager
    async def stream(self, body: dict[str, Any]) -> AsyncIterator[_Stream]:
        response = await open_response(self._client, self._url, codec.dumps(body), self._headers)
        try:
            yield _Stream(response, MAX_ERROR_BODY if response.status_code >= 400 else self._limit)
        finally:
            await response.aclose()
