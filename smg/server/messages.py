"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: one request, one event stream.

The handler emits `received`, admits the request (auth, content type, JSON, validation →
`validated` or `rejected`), hands the call to the router and feeds every event the router
yields to the journal and to the projection that writes the response. Whatever happens, the
sequence ends with `completed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import Any

from journal.events import Block, Completed, Error, Received, Rejected, Tokens, Upstream, Validated
from journal.redact import MINIMAL_VALUE_CHARS, minimal_headers
from smg.backends.base import Call, Endpoint
from smg.flow import Flow
from smg.projection import Projection, Whole, error_response
from smg.protocol import codec
from smg.protocol.errors import ApiError, invalid_request
from smg.protocol.parse import parse_count_tokens, parse_create_message
from smg.protocol.usage import UsageReader
from smg.server.auth import check_bearer, tenant_of
from smg.server.responder import Responder
from smg.server.state import Gateway

log = logging.getLogger("smg.messages")


def _check_content_type(headers: dict[str, str]) -> None:
    value = headers.get("content-type")
    if not value:
        raise invalid_request("Missing Content-Type: application/json header", code="json_parse_error")
    media = value.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise invalid_request(
            f"Expected request with `Content-Type: application/json`, got `{value}`", code="json_parse_error"
        )


def admit(gateway: Gateway, endpoint: Endpoint, headers: dict[str, str], body: bytes, request_id: str) -> Call:
    """Everything a request must pass before a backend sees it. Raises `ApiError`."""
    check_bearer(gateway.config.api_key, headers)
    _check_content_type(headers)
    try:
        data = codec.loads(body)
    except codec.BodyDecodeError as exc:
        raise invalid_request(f"JSON syntax error: {exc}", code="json_parse_error") from None
    if endpoint == "messages":
        request: Any = parse_create_message(data, anthropic_beta=headers.get("anthropic-beta"))
        stream = bool(request.stream)
    else:
        request = parse_count_tokens(data)
        stream = False
    model = gateway.config.canonical_model(request.model)
    return Call(
        request_id=request_id,
        endpoint=endpoint,
        model=model,
        stream=stream,
        body=data,
        request=request,
        headers=headers,
        raw=body,
        alias_used=model != request.model,
    )


def _summary(call: Call) -> dict[str, Any]:
    req = call.request
    out: dict[str, Any] = {"messages": len(req.messages)}
    for name in ("max_tokens", "tools", "tool_choice", "thinking"):
        value = getattr(req, name, None)
        if value is None:
            continue
        out[name] = len(value) if name == "tools" else value if isinstance(value, int) else getattr(value, "type", None)
    if call.alias_used:
        out["alias"] = req.model
    return out


def _authorized(gateway: Gateway, headers: dict[str, str]) -> bool:
    try:
        check_bearer(gateway.config.api_key, headers)
    except ApiError:
        return False
    return True


def _received(request: Any, gateway: Gateway, body: bytes) -> Received:
    """The first event of every request (the journal redacts its secrets as it queues it).

    A request without the gateway key is journaled without its body and with only a few
    headers, clipped: anyone who can reach the port must not be able to fill the disk.
    """
    headers: dict[str, str] = request.ctx.headers
    query: str = request.query_string
    if not _authorized(gateway, headers):
        headers, query, body = minimal_headers(headers), query[:MINIMAL_VALUE_CHARS], b""
    return Received(
        request_id=request.ctx.journal_id,
        client_request_id=request.ctx.client_request_id,
        method=request.method,
        path=request.path,
        query=query,
        headers=headers,
        body=body.decode("utf-8", errors="replace") if body else None,
        client=request.ip or None,
        tenant=tenant_of(gateway.config.api_key, headers, request.ip),
        ts=time.time(),
    )


async def serve(request: Any, endpoint: Endpoint) -> None:
    gateway: Gateway = request.app.ctx.gateway
    rid: str = request.ctx.request_id
    headers: dict[str, str] = request.ctx.headers
    flow = Flow(request.ctx.journal_id, gateway.journal, t0=request.ctx.t0)
    responder = Responder(request)
    projection = Projection(rid)
    body: bytes = request.body or b""
    await flow.emit(_received(request, gateway, body))
    disconnected = False
    stage = "admission"
    outcome = UsageReader()
    try:
        try:
            call = admit(gateway, endpoint, headers, body, rid)
            await flow.emit(Validated(model=call.model, stream=call.stream, summary=_summary(call)))
            projection.stream = call.stream
            stage = "backend"
            # aclosing: a client that goes away closes the upstream at once, not at GC time.
            async with aclosing(gateway.router.handle(call)) as events:
                async for event in events:
                    await flow.emit(event)
                    _observe(outcome, event)
                    if actions := projection.feed(event):  # a `tokens` event sends nothing
                        await responder.run(actions)
            await responder.run(projection.finish())
            if projection.relayed_error is not None:  # what the client was told, for the summary row
                await flow.emit(projection.relayed_error)
            if not responder.responded:
                raise ApiError(502, "The worker closed the request without answering", code="no_response_produced")
        except ApiError as err:
            await _fail(flow, projection, responder, err, stage)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request %s failed", rid)
            internal = ApiError(
                500, "Internal gateway error; the request id identifies it in the journal", code="internal_error"
            )
            await _fail(flow, projection, responder, internal, stage)
    except asyncio.CancelledError:
        disconnected = True
        raise
    finally:
        await flow.emit(
            Completed(
                status=responder.status or 499,
                duration_ms=round(flow.elapsed() * 1000, 3),
                bytes_sent=responder.bytes_sent,
                disconnected=disconnected,
                usage=outcome.final_usage() or None,
                stop_reason=outcome.stop_reason,
            )
        )


def _observe(outcome: UsageReader, event: object) -> None:
    """Note how the response ended (usage, stop_reason) for the `completed` event."""
    if isinstance(event, Upstream) and event.encoding == "utf-8" and event.data:
        if event.part == "chunk":
            outcome.chunk(event.data)
        elif event.part == "body":
            outcome.body(event.data)
    elif isinstance(event, Block):
        outcome.event(event.event)
    elif isinstance(event, Tokens):
        outcome.generated(event.completion_tokens if event.completion_tokens is not None else 0)


def error_event(err: ApiError, stage: str = "admission") -> Error:
    """What the client is told about a failure, as a journal event."""
    return Error(
        stage=stage,
        status=err.status,
        error_type=err.type,
        message=err.message,
        code=err.code,
        headers=err.response_headers(),
    )


def _rejected(err: ApiError) -> Rejected:
    return Rejected(status=err.status, error_type=err.type, message=err.message, code=err.code)


async def _fail(flow: Flow, projection: Projection, responder: Responder, err: ApiError, stage: str) -> None:
    if stage == "admission":
        await flow.emit(_rejected(err))
    event = await flow.emit(error_event(err, stage))
    await responder.run(projection.feed(event))


async def refuse(request: Any, err: ApiError) -> Whole:
    """A Messages-path request refused before it reached a handler of its own (unknown route,
    wrong method, body too large): journaled like any other refusal; the caller sends the
    returned response."""
    gateway: Gateway = request.app.ctx.gateway
    rid: str = request.ctx.request_id
    flow = Flow(request.ctx.journal_id, gateway.journal, t0=request.ctx.t0)
    await flow.emit(_received(request, gateway, b""))
    await flow.emit(_rejected(err))
    error = error_event(err)
    await flow.emit(error)
    whole = error_response(rid, error)
    await flow.emit(
        Completed(status=whole.status, duration_ms=round(flow.elapsed() * 1000, 3), bytes_sent=len(whole.body))
    )
    return whole
