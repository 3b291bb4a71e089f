"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: one request, one event stream.

The handler emits `received`, admits the request (auth, content type, JSON, validation →
`validated` or `rejected`), hands the call to the router and feeds every event the router
yields to the journal and to the projection that writes the response. Whatever happens, the
sequence ends with `completed`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any

from journal.events import Block, Completed, Error, Received, Rejected, Rendered, Tokens, Upstream, Validated
from journal.redact import MINIMAL_VALUE_CHARS, minimal_headers
from smg.admission import Refused
from smg.backends.base import Call, Endpoint
from smg.flow import Flow
from smg.observability import logs, metrics, tracing
from smg.projection import Projection, Whole, error_response
from smg.protocol import codec
from smg.protocol.errors import ApiError, invalid_request
from smg.protocol.parse import parse_count_tokens, parse_create_message
from smg.protocol.usage import UsageReader
from smg.server.auth import caller, tenant_of
from smg.server.memory import release_after
from smg.server.observe import RequestObserver, start_trace
from smg.server.responder import Responder
from smg.server.state import Gateway

log = logging.getLogger("smg.messages")

_PARSE_INLINE_BYTES = 1 << 20
# One thread parses the large bodies, one after another: parsing holds the GIL, and every thread
# more that holds it lengthens the event loop's wait for it without parsing any faster.
_LARGE_BODIES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smg-large-body")
# The upstream clients time one attempt out at --request-timeout-secs too: a single slow attempt
# is answered by its connector, with the connector's own code, a moment before the request's
# deadline would cut it; the deadline decides when retries or a hung engine would run past it.
_DEADLINE_GRACE_SECS = 1.0


def _check_content_type(headers: dict[str, str]) -> None:
    value = headers.get("content-type")
    if not value:
        raise invalid_request("Missing Content-Type: application/json header", code="json_parse_error")
    media = value.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise invalid_request(
            f"Expected request with `Content-Type: application/json`, got `{value}`", code="json_parse_error"
        )


def admit(
    gateway: Gateway,
    endpoint: Endpoint,
    headers: dict[str, str],
    body: bytes,
    request_id: str,
    client_ip: str | None = None,
) -> Call:
    """Everything a request must pass before the gates and the router see it. Raises `ApiError`."""
    tenant = caller(gateway, headers, client_ip).tenant
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
        tenant=tenant,
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
        caller(gateway, headers, None)
    except ApiError:
        return False
    return True


def _received(request: Any, gateway: Gateway, body: bytes, trace_id: str | None = None) -> Received:
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
        tenant=tenant_of(gateway, headers, request.ip or None),
        ts=time.time(),
        trace_id=trace_id if trace_id is not None else tracing.client_trace_id(request.ctx.headers),
    )


def _observer(request: Any, endpoint: Endpoint, received: Received) -> RequestObserver | None:
    """The request's metrics, trace and access line, when any of them is on."""
    trace = start_trace(request.method, request.path, request.ctx.headers, request.ctx.t0, received.request_id)
    if trace is None and metrics.current is None and logs.ACCESS.disabled:
        return None
    generates = request.app.ctx.gateway.router.generates
    return RequestObserver(request.method, request.path, endpoint, received.tenant, trace, generates)


async def serve(request: Any, endpoint: Endpoint) -> None:
    gateway: Gateway = request.app.ctx.gateway
    rid: str = request.ctx.request_id
    headers: dict[str, str] = request.ctx.headers
    flow = Flow(request.ctx.journal_id, gateway.journal, t0=request.ctx.t0)
    responder = Responder(request)
    projection = Projection(rid)
    body: bytes = request.body or b""
    request.ctx.observed = True  # this handler counts its own response (it may be a stream)
    received = _received(request, gateway, body)
    observer = _observer(request, endpoint, received)
    if observer is not None and observer.trace is not None:
        received.trace_id = observer.trace.trace_id
    await flow.emit(received)
    disconnected = False
    stage = "admission"
    code: str | None = None
    outcome = UsageReader()
    try:
        try:
            if len(body) > _PARSE_INLINE_BYTES:
                # Megabytes of JSON parse and validate for a noticeable time: not on the event loop.
                call = await asyncio.get_running_loop().run_in_executor(
                    _LARGE_BODIES,
                    contextvars.copy_context().run,
                    functools.partial(admit, gateway, endpoint, headers, body, rid, request.ip or None),
                )
            else:
                call = admit(gateway, endpoint, headers, body, rid, request.ip or None)
            # A large body's parse is handed to the journal's search index, which would parse it again.
            parsed = call.body if len(body) > _PARSE_INLINE_BYTES else None
            validated = await flow.emit(
                Validated(model=call.model, stream=call.stream, summary=_summary(call), parsed_body=parsed)
            )
            if observer is not None:
                observer.validated, observer.model, observer.stream = validated.t, call.model, call.stream
                if observer.trace is not None:
                    # The worker continues the gateway's span, not the client's.
                    call.headers = {**call.headers, **observer.trace.propagation_headers()}
            projection.stream = call.stream
            stage = "backend"
            deadline = asyncio.timeout(gateway.config.request_timeout_secs + _DEADLINE_GRACE_SECS - flow.elapsed())
            try:
                async with deadline:
                    # aclosing: a client that goes away closes the upstream at once, not at GC time.
                    async with aclosing(gateway.handle(call)) as events:
                        async for event in events:
                            _observe(outcome, event)  # before the journal has it: see `_observe`
                            await flow.emit(event)
                            if observer is not None:
                                observer.see(event)
                            if actions := projection.feed(event):  # a `tokens` event sends nothing
                                await responder.run(actions)
            except TimeoutError:
                if not deadline.expired():
                    raise
                raise _past_deadline(gateway.config.request_timeout_secs) from None
            await responder.run(projection.finish())
            if projection.relayed_error is not None:  # what the client was told, for the summary row
                code = projection.relayed_error.code
                await flow.emit(projection.relayed_error)
            if not responder.responded:
                raise ApiError(502, "The worker closed the request without answering", code="no_response_produced")
        except Refused as err:  # a gate's answer, whatever stage the request had reached
            code = err.code
            await _fail(flow, projection, responder, err, "admission")
        except ApiError as err:
            code = err.code
            await _fail(flow, projection, responder, err, stage)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request %s failed", rid)
            internal = ApiError(
                500, "Internal gateway error; the request id identifies it in the journal", code="internal_error"
            )
            code = internal.code
            await _fail(flow, projection, responder, internal, stage)
    except asyncio.CancelledError:
        # A client that closes its connection once it has the whole answer did not hang up on
        # it, even if the handler was still winding down (closing an upstream leg) when it did.
        disconnected = not responder.finished
        raise
    finally:
        completed = Completed(
            status=responder.status or 499,
            duration_ms=round(flow.elapsed() * 1000, 3),
            bytes_sent=responder.bytes_sent,
            disconnected=disconnected,
            usage=outcome.final_usage() or None,
            stop_reason=outcome.stop_reason,
        )
        await flow.emit(completed)
        if observer is not None:
            # As the reference counts it: a client gone first is 499 whatever the head said.
            observer.finish(
                request_id=received.request_id,
                status=499 if disconnected else completed.status,
                code="client_closed_request" if disconnected else code,
                duration=completed.t,
                usage=completed.usage,
                disconnected=disconnected,
            )
        # Sanic keeps the request in a context variable, and every task and timer started while
        # it was handled (an upstream connection's, kept in the pool) keeps a copy of that
        # context: the request object may outlive it for minutes, its body must not.
        request.body = b""
        release_after(len(body))


def _past_deadline(seconds: float) -> ApiError:
    """The request's one deadline (`--request-timeout-secs`) passed: every attempt, retries and
    backoff included, on every backend. The engine or upstream request was closed (aborted)."""
    return ApiError(504, f"Request timeout: the request did not complete within {seconds:g} s", code="request_timeout")


def _observe(outcome: UsageReader, event: object) -> None:
    """Note how the response ended (usage, stop_reason) for the `completed` event. A whole
    body's parse goes with its event to the journal, whose search index reads the message too."""
    if isinstance(event, Upstream) and event.encoding == "utf-8" and event.data:
        if event.part == "chunk":
            outcome.chunk(event.data)
        elif event.part == "body":
            event.parsed = outcome.body(event.data)
    elif isinstance(event, Block):
        outcome.event(event.event)
    elif isinstance(event, Tokens):
        outcome.generated(event.completion_tokens if event.completion_tokens is not None else 0)
    elif isinstance(event, Rendered):
        outcome.rendered(event.prompt_tokens)


def error_event(err: ApiError, stage: str = "admission") -> Error:
    """What the client is told about a failure, as a journal event."""
    return Error(
        stage=stage,
        status=err.status,
        error_type=err.type,
        message=err.message,
        code=err.code,
        headers=err.response_headers(),
        detail=err.detail,
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
    request.ctx.error_code = err.code  # for the metrics of the response the caller sends
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
