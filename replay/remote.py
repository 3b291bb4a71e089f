"""Replay against a live gateway or worker: the recorded request sent again, the answer diffed.

What is sent: the recorded method, path, query and body (the client's bytes as journaled), and
the recorded headers a worker would get (the spec's allowlist, `smg.protocol.headers`) minus
every secret. The journal keeps only fingerprints of
secrets, and those are never sent: credentials come from the operator (`headers`, e.g.
`Authorization: Bearer …`), MCP server tokens from `mcp_tokens`, URLs with credentials from
`secret_urls` (a recorded URL whose credentials were redacted is never sent). The request-id headers are
dropped too, so the target files the replay under an id of its own instead of the original's;
`x-smg-replay-of: <original id>` names the original, and a gateway journaling the replay marks
its row `replay_of`.

The replay run is journaled here as a request of its own, under a new id, with `replay_of` set:
`received` (as sent; the writer redacts its secrets), `validated` when the body passes the
gateway's rules, `routed` (backend `replay`, the target as worker), the answer as `upstream`
head and chunks (a stream) or body, an `error` when the target could not be reached, and
`completed`. Nothing is written under the original's id.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import string
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from journal.events import Completed, Error, Event, Received, Routed, Upstream, Validated
from journal.pieces import TextPieces, text_piece
from journal.redact import SECRET_HEADERS, fleet_secret, read_secret, redact_url
from journal.summary import REPLAY_HEADER
from journal.writer import JournalWriter
from replay.diff import Difference, Outcome, deterministic, diff, from_http
from smg.projection import reconstruct
from smg.protocol import codec
from smg.protocol.errors import ApiError, describe_exception, error_from_upstream
from smg.protocol.headers import is_forwarded
from smg.protocol.parse import parse_count_tokens, parse_create_message
from smg.protocol.usage import UsageReader

# A gateway turns its MCP tool loop on with this header; without it the replay would not take
# the path the original took.
GATEWAY_HEADERS = frozenset({"x-smg-mcp"})
# A gateway takes its request id from these: sending the original's would file the replay
# under the original's id.
REQUEST_ID_HEADERS = frozenset({"x-request-id", "x-correlation-id", "x-trace-id", "request-id"})
_REDACTED = "[redacted sha256:"
# `journal.redact.redact_url`'s marker, percent-encoded inside a URL.
_REDACTED_IN_URL = "[redacted%20sha256:"
_FINGERPRINT = "[text sha256:"  # journal.bodies' stand-in for content it did not keep
_TOKEN_KEY = "authorization_token"
_ALPHANUMERIC = string.ascii_letters + string.digits


class ReplayError(Exception):
    """The request cannot be replayed as asked (the message says why and what to supply)."""


def new_replay_id() -> str:
    return "replay_" + "".join(_ALPHANUMERIC[b % 62] for b in secrets.token_bytes(24))


def forwarded_headers(recorded: Mapping[str, str], supplied: Mapping[str, str], original_id: str) -> dict[str, str]:
    """The headers of the replay: the recorded allowlisted ones without secrets or request ids,
    the operator's (which win), and the replay marker."""
    out: dict[str, str] = {}
    content_type = "application/json"
    for name, value in recorded.items():
        key = name.lower()
        if key == "content-type":
            content_type = value
            continue
        if key in SECRET_HEADERS or key in REQUEST_ID_HEADERS or value.startswith(_REDACTED):
            continue
        if is_forwarded(key) or key in GATEWAY_HEADERS:
            out[key] = value
    out["content-type"] = content_type
    for name, value in supplied.items():
        out[name.lower()] = value
    out[REPLAY_HEADER] = original_id
    return out


def body_to_send(
    body: str | None,
    mcp_tokens: Mapping[str, str] | None = None,
    secret_urls: Iterable[str] = (),
    key: bytes | None = None,
) -> str:
    """The recorded body, with each secret the journal redacted put back: MCP server tokens
    from `mcp_tokens` (server name → token), and each URL whose credentials were redacted
    (userinfo, a token in its query: an MCP server's, an image's) from `secret_urls`, the URLs
    as the client sent them, each matched to the recorded one it redacts to (with the journal's
    `key`, `journal.redact.read_secret`, or bare as older files hold them). Raises
    `ReplayError` naming every secret nobody supplied: a replay never sends a fingerprint in
    place of a credential."""
    if not body or (_REDACTED not in body and _REDACTED_IN_URL not in body):
        return body or ""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    missing: list[str] = []
    out = body
    servers = data.get("mcp_servers") if isinstance(data, dict) and _TOKEN_KEY in body else None
    missing_tokens: list[str] = []
    for server in servers if isinstance(servers, list) else []:
        if not isinstance(server, dict):
            continue
        token = server.get(_TOKEN_KEY)
        if not isinstance(token, str) or not token.startswith(_REDACTED):
            continue
        name = str(server.get("name", ""))
        supplied = (mcp_tokens or {}).get(name)
        if supplied is None:
            missing_tokens.append(name)
            continue
        # The redacted value is unique to its token: replacing its JSON string keeps every
        # other byte of the body as the client sent it.
        out = out.replace(json.dumps(token), json.dumps(supplied))
    if missing_tokens:
        names = ", ".join(repr(n) for n in missing_tokens)
        missing.append(
            f"the request's MCP server token(s) for {names} are not in the journal (only a fingerprint is);"
            " supply them with --mcp-token NAME=TOKEN"
        )
    by_redaction = {redact_url(url, k): url for url in secret_urls for k in dict.fromkeys([key, None])}
    missing_urls: list[str] = []
    for recorded in dict.fromkeys(_redacted_urls(data, [])):
        real = by_redaction.get(recorded)
        if real is None:
            missing_urls.append(recorded)
            continue
        for quoted in {json.dumps(recorded), json.dumps(recorded, ensure_ascii=False)}:
            out = out.replace(quoted, json.dumps(real, ensure_ascii=False))
    if missing_urls:
        names = ", ".join(repr(u) for u in missing_urls)
        missing.append(
            f"the credentials of the URL(s) {names} are not in the journal (only fingerprints are);"
            " supply each as the client sent it with --secret-url URL"
        )
    if missing:
        raise ReplayError("; ".join(missing))
    return out


def _redacted_urls(value: Any, found: list[str]) -> list[str]:
    """Every string in `value` that is an http(s) URL with a redacted credential."""
    if isinstance(value, str):
        if _REDACTED_IN_URL in value and value.strip()[:8].lower().startswith(("http://", "https://")):
            found.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _redacted_urls(item, found)
    elif isinstance(value, list):
        for item in value:
            _redacted_urls(item, found)
    return found


@dataclass
class RemoteResult:
    """One replay against a live target, and how its answer compares with the original's."""

    replay_id: str  # the replay run's row in the journal written here
    original_id: str
    url: str
    status: int | None = None  # None: no answer (see `error`)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    streamed: bool = False
    target_request_id: str | None = None  # the target's own id for it (`x-request-id`)
    error: str | None = None
    # Why there is no whole answer: "connection" (none made, or it closed before an answer),
    # "timeout", or "broke_off" (the answer started and was cut). None with a whole answer.
    failure: str | None = None
    latency_ms: float | None = None  # from sending to the answer's last byte
    ttft_ms: float | None = None  # to the answer's head (JSON), or to its first chunk (a stream)
    text_compared: bool = False
    differences: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.error is None and not self.differences


async def replay_to(
    events: Iterable[Event],
    url: str,
    headers: Mapping[str, str],
    journal_path: str | Path | None,
    *,
    exact: bool = False,
    text: bool | None = None,
    mcp_tokens: Mapping[str, str] | None = None,
    secret_urls: Iterable[str] = (),
    timeout: float = 600.0,
    writer: JournalWriter | None = None,
    client: httpx.AsyncClient | None = None,
    started_at: float | None = None,
) -> RemoteResult:
    """Send the recorded request to `url` (a gateway's or worker's base URL), journal the run
    in `journal_path` (None: not journaled) and diff the answer against the original's.

    `text` compares text, thinking and tool input; by default only when the recorded request
    decodes greedily (`replay.diff.deterministic`) or `exact` is set. A batch of replays
    passes its own started `writer` (which then wins over `journal_path`) and `client`, both
    left open here, and `started_at`, when it started the request (epoch seconds: the run's
    arrival time in the journal; default now)."""
    events = list(events)
    received = next((e for e in events if isinstance(e, Received)), None)
    if received is None:
        raise ReplayError("the request has no `received` event: there is nothing to send")
    original_id = received.request_id
    if received.body is None:
        raise ReplayError("the journal holds no body for it (none recorded, or --journal-bodies none): nothing to send")
    if _FINGERPRINT in received.body:
        raise ReplayError("the body was journaled redacted (--journal-bodies redacted): replay needs full bodies")
    # Read from the fleet journal (no file to journal in): keyed as its replicas key, `$SMG_TENANT_SECRET`.
    key = read_secret(journal_path) if journal_path is not None else fleet_secret()
    body = body_to_send(received.body, mcp_tokens, secret_urls, key)
    sent_headers = forwarded_headers(received.headers, headers, original_id)
    target = url.rstrip("/") + received.path + (f"?{received.query}" if received.query else "")
    result = RemoteResult(replay_id=new_replay_id(), original_id=original_id, url=target)

    owned = writer is None and journal_path is not None
    if writer is None and journal_path is not None:
        # Fingerprints keyed as the gateway writing that journal keys them (`journal.redact`).
        writer = JournalWriter(journal_path, secret=key)
    seq = 0
    t0 = time.perf_counter()

    async def emit(event: Event) -> None:
        nonlocal seq
        if writer is None:
            return
        event.t = time.perf_counter() - t0
        seq += 1
        await writer.append(result.replay_id, seq, event)

    if owned:
        assert writer is not None
        await writer.start()
    try:
        await emit(
            Received(
                request_id=result.replay_id,
                method=received.method,
                path=received.path,
                query=received.query,
                headers=dict(sent_headers),
                body=body or None,
                ts=started_at if started_at is not None else time.time(),
            )
        )
        validated = _validated(received.path, body, sent_headers)
        if validated is not None:
            await emit(validated)
        await emit(Routed(backend="replay", worker=url, model=_model_of(body)))
        try:
            if client is None:
                async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0)) as own:
                    failed = await _exchange(result, own, received.method, target, body, sent_headers, url, emit)
            else:
                failed = await _exchange(result, client, received.method, target, body, sent_headers, url, emit)
        except asyncio.CancelledError:
            # Abandoned (a batch stopped by Ctrl-C): the run is closed as a gateway closes a
            # request whose client went away, rather than left in flight.
            duration = round((time.perf_counter() - t0) * 1000, 3)
            await emit(Completed(status=result.status or 499, duration_ms=duration, disconnected=True))
            raise
        if result.status is not None and result.status >= 400:
            await emit(_target_error(result))
        usage = UsageReader()
        if result.streamed:
            usage.chunk(result.body.decode("utf-8", "replace") + "\n\n")
        elif result.body:
            usage.body(result.body.decode("utf-8", "replace"))
        await emit(
            Completed(
                status=result.status or failed or 502,
                duration_ms=round((time.perf_counter() - t0) * 1000, 3),
                usage=usage.usage or None,
                stop_reason=usage.stop_reason,
                bytes_sent=len(result.body),
            )
        )
    finally:
        if owned:
            assert writer is not None
            await writer.close()

    if result.status is not None:
        recorded_body = _json_or_none(received.body)
        result.text_compared = text if text is not None else (exact or deterministic(recorded_body))
        original = reconstruct(events)
        result.differences = diff(
            original, from_http(result.status, result.headers, result.body), text=result.text_compared, exact=exact
        )
    return result


def is_replay_run(events: Iterable[Event]) -> bool:
    """Whether these are the events `replay_to` journals for its own run (`routed` to `replay`)."""
    return any(isinstance(e, Routed) and e.backend == "replay" for e in events)


def target_answer(events: Iterable[Event]) -> Outcome | None:
    """The target's answer as a replay run journaled it (`upstream` head, then its body or
    chunks), folded for `diff`: what `replay_to` itself compared. Rebuilding it through the
    relay projection instead would drop the target's `x-smg-error-code`, which a relay never
    passes on, and report a minted error's code as a difference. None without an answer."""
    head: Upstream | None = None
    body = b""
    for event in events:
        if not isinstance(event, Upstream):
            continue
        if event.part == "head":
            head, body = event, b""
        elif head is not None and event.part in ("chunk", "body"):
            body += event.payload()
    if head is None:
        return None
    return from_http(head.status, head.headers or {}, body)


def _target_error(result: RemoteResult) -> Error:
    """The target's error answer as an `error` event, so that the replay's summary row has
    its error type and the gateway's machine code (`x-smg-error-code`) like the original's."""
    assert result.status is not None
    err = error_from_upstream(result.status, result.body, result.headers)
    if result.streamed or not err.error_type:  # an SSE error frame names its type
        outcome = from_http(result.status, result.headers, result.body)
        err.error_type = outcome.error_type or err.error_type
    return Error(
        stage="target",
        status=result.status,
        error_type=err.type,
        message=err.message,
        code=result.headers.get("x-smg-error-code"),
    )


def _json_or_none(body: str | None) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _model_of(body: str) -> str:
    data = _json_or_none(body)
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else ""


def _validated(path: str, body: str, headers: Mapping[str, str]) -> Validated | None:
    """`validated` when the body passes the gateway's own rules (what the target will check too)."""
    try:
        data = codec.loads(body.encode())
        if path.rstrip("/").endswith("/count_tokens"):
            request: Any = parse_count_tokens(data)
            stream = False
        else:
            request = parse_create_message(data, anthropic_beta=headers.get("anthropic-beta"))
            stream = bool(request.stream)
    except (ApiError, codec.BodyDecodeError):
        return None
    return Validated(model=str(request.model), stream=stream)


async def _exchange(
    result: RemoteResult,
    client: httpx.AsyncClient,
    method: str,
    target: str,
    body: str,
    headers: Mapping[str, str],
    worker: str,
    emit: Any,
) -> int | None:
    """Send the request; collect the answer into `result` and journal it as `upstream` parts.
    Returns the status to journal for a failure that left no answer (else None)."""
    sent = time.perf_counter()
    try:
        request = client.build_request(method, target, content=body.encode(), headers=dict(headers))
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        timed_out = isinstance(exc, httpx.TimeoutException)
        status = 504 if timed_out else 502
        result.error = f"{describe_exception(exc)}. URL: {target}"
        result.failure = "timeout" if timed_out else "connection"
        code = "call_upstream_timeout" if timed_out else "call_upstream_connection_failed"
        await emit(Error(stage="replay", status=status, error_type="api_error", message=result.error, code=code))
        return status
    try:
        result.status = response.status_code
        result.headers = {k.lower(): v for k, v in response.headers.multi_items()}
        result.target_request_id = response.headers.get("x-request-id")
        result.streamed = "text/event-stream" in response.headers.get("content-type", "") and result.status < 400
        if not result.streamed:
            result.ttft_ms = _ms_since(sent)
        await emit(Upstream(part="head", status=result.status, headers=dict(result.headers), worker=worker))
        parts: list[bytes] = []
        pieces = TextPieces()
        try:
            async for chunk in response.aiter_bytes():
                if result.ttft_ms is None:
                    result.ttft_ms = _ms_since(sent)
                parts.append(chunk)
                piece = pieces.feed(chunk) if result.streamed else None
                if piece:
                    await emit(Upstream(part="chunk", data=piece[0], encoding=piece[1]))
        except httpx.HTTPError as exc:
            result.error = f"the answer broke off: {describe_exception(exc)}"
            result.failure = "timeout" if isinstance(exc, httpx.TimeoutException) else "broke_off"
        result.latency_ms = _ms_since(sent)
        result.body = b"".join(parts)
        if result.streamed:
            tail = pieces.flush()
            if tail:
                await emit(Upstream(part="chunk", data=tail[0], encoding=tail[1]))
        elif result.error is None:
            data, encoding = text_piece(result.body)
            await emit(Upstream(part="body", data=data, encoding=encoding))
        if result.error is not None:
            await emit(
                Error(
                    stage="replay",
                    status=502,
                    error_type="api_error",
                    message=result.error,
                    code="upstream_stream_interrupted" if result.streamed else "upstream_read_failed",
                )
            )
    finally:
        await response.aclose()
    return None


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)
