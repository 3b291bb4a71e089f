"""A request's summary row, folded from its events; and a one-line description per event.

`apply` is pure bookkeeping on a dict whose keys are `requests` columns
(`journal.schema.REQUEST_COLUMNS`): the writer keeps one dict per in-flight request, folds
each event in as it is written, and upserts the row in the same transaction as the events.
A key that is absent means "not known yet" (NULL); the writer's upsert never overwrites a
known value with NULL. Keys that start with `_` are the fold's own (the cache token counts a
cost needs, the body a refused request's model is read from) and are not columns.

`price` gives a completed request its `cost_usd` by the operator's price table
(`journal.prices`), from the model and the usage the fold kept.
"""

from __future__ import annotations

from typing import Any

import orjson

from journal import search
from journal.events import (
    Admission,
    Block,
    Completed,
    Counted,
    Error,
    Event,
    McpCall,
    McpConnect,
    McpResult,
    ModelCall,
    ModelResult,
    Received,
    Rejected,
    Rendered,
    Routed,
    Settled,
    StreamOpened,
    Tokens,
    Upstream,
    Validated,
)
from journal.prices import PriceTable

REPLAY_HEADER = "x-smg-replay-of"
_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def apply(summary: dict[str, Any], request_id: str, event: Event) -> None:
    """Fold one event into `summary` (mutated in place)."""
    summary["id"] = request_id
    if isinstance(event, Block):
        _apply_block(summary, event)
    elif isinstance(event, Upstream):
        if not event.part.startswith("prefill:"):  # a prefill leg's answer is not the client's
            _first_event(summary, event)
    elif isinstance(event, Counted):
        _first_event(summary, event)
        summary["input_tokens"] = event.input_tokens
    elif isinstance(event, Received):
        summary["ts"] = event.ts
        summary["method"] = event.method
        summary["path"] = event.path
        summary["tenant"] = event.tenant
        if event.body:  # a reference, read only for a request refused before validation
            summary["_body"] = event.body
        if event.client_request_id is not None:
            summary["client_id"] = event.client_request_id
        replay_of = _header(event.headers, REPLAY_HEADER)
        if replay_of:
            summary["replay_of"] = replay_of
    elif isinstance(event, Validated):
        summary.pop("_body", None)
        summary["model"] = event.model
        summary["stream"] = int(bool(event.stream))
    elif isinstance(event, Routed):
        summary["backend"] = event.backend
        summary["worker"] = event.worker
        summary["model"] = event.model
    elif isinstance(event, Rendered):
        # The prompt's size, known before the engine answers: kept if the stream is cut before
        # its usage arrives (message_start or completion restate it when they come).
        if summary.get("input_tokens") is None:
            summary["input_tokens"] = event.prompt_tokens
    elif isinstance(event, Rejected | Error):
        if summary.get("model") is None:
            _asked_model(summary)
        summary["status"] = event.status
        summary["error_code"] = event.code
        summary["error_type"] = event.error_type
    elif isinstance(event, Completed):
        summary["status"] = event.status
        summary["duration_ms"] = event.duration_ms
        summary["bytes_sent"] = event.bytes_sent
        if event.stop_reason is not None:
            summary["stop_reason"] = event.stop_reason
        _apply_usage(summary, event.usage)
        summary["completed"] = 1
    search.fold(summary, event)


def _apply_block(summary: dict[str, Any], event: Block) -> None:
    _first_event(summary, event)
    payload = event.event
    kind = payload.get("type")
    if kind == "content_block_start":
        block = payload.get("content_block") or {}
        block_type = block.get("type")
        if block_type in _TOOL_BLOCKS:
            summary["has_tool_use"] = 1
        elif block_type in _THINKING_BLOCKS:
            summary["has_thinking"] = 1
    elif kind == "message_delta":
        stop = (payload.get("delta") or {}).get("stop_reason")
        if stop is not None:
            summary["stop_reason"] = stop
        _apply_usage(summary, payload.get("usage"))
    elif kind == "message_start":
        # The prompt size is known here; message_delta may repeat or omit it.
        usage = (payload.get("message") or {}).get("usage") or {}
        if usage.get("input_tokens") is not None:
            summary["input_tokens"] = usage["input_tokens"]
        _apply_usage(summary, {k: v for k, v in usage.items() if k != "output_tokens"})


def _asked_model(summary: dict[str, Any]) -> None:
    """A request refused before it was validated (admission, authentication, a bad body)
    still names the model its body asked for, when the body says one."""
    body = summary.get("_body")
    if not body:
        return
    try:
        model = orjson.loads(body).get("model")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return
    if isinstance(model, str) and model:
        summary["model"] = model


def price(summary: dict[str, Any], table: PriceTable) -> None:
    """Set `cost_usd` of a completed request by `table` (NULL when its model has no price)."""
    usage = {
        "input_tokens": summary.get("input_tokens"),
        "output_tokens": summary.get("output_tokens"),
        "cache_read_input_tokens": summary.get("_cache_read"),
        "cache_creation_input_tokens": summary.get("_cache_write"),
    }
    summary["cost_usd"] = table.cost(summary.get("model"), usage)


def _first_event(summary: dict[str, Any], event: Event) -> None:
    if summary.get("ttfe_ms") is None:
        summary["ttfe_ms"] = event.t * 1000.0


def _apply_usage(summary: dict[str, Any], usage: dict[str, Any] | None) -> None:
    if not usage:
        return
    for key in ("input_tokens", "output_tokens"):
        if usage.get(key) is not None:
            summary[key] = usage[key]
    for key, name in (("cache_read_input_tokens", "_cache_read"), ("cache_creation_input_tokens", "_cache_write")):
        if usage.get(key) is not None:
            summary[name] = usage[key]


def _header(headers: dict[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


# ---------------------------------------------------------------------------------------
# One line per event, for timelines (`smg journal show`, the inspector).

_PREVIEW = 60


def describe(event: Event) -> str:
    """A short human description of one event (its kind excluded)."""
    if isinstance(event, Block):
        return _describe_block(event.event)
    if isinstance(event, Tokens):
        parts = [f"+{len(event.ids)} ids {_clip(str(event.ids), 40)}"]
        if event.completion_tokens is not None:
            parts.append(f"completion={event.completion_tokens}")
        if event.finish_reason:
            parts.append(f"finish={event.finish_reason}")
        if event.matched_stop is not None:
            parts.append(f"matched_stop={event.matched_stop!r}")
        return " ".join(parts)
    if isinstance(event, Upstream):
        if event.part == "head":
            return f"head {event.status} {len(event.headers or {})} headers"
        size = len(event.data or "")
        enc = "" if event.encoding == "utf-8" else f" ({event.encoding})"
        return f"{event.part} {size}B{enc} {_clip(repr(event.data or ''))}"
    if isinstance(event, Received):
        size = len(event.body.encode("utf-8", "surrogatepass")) if event.body else 0
        tail = "".join(f" {k}={v}" for k, v in (("tenant", event.tenant), ("client", event.client)) if v)
        query = f"?{event.query}" if event.query else ""
        return f"{event.method} {event.path}{query} body={size}B{tail}"
    if isinstance(event, Validated):
        return f"model={event.model} stream={str(event.stream).lower()}"
    if isinstance(event, Routed):
        extra = f" policy={event.policy}" if event.policy else ""
        again = f" attempt={event.attempt}" if event.attempt != 1 else ""
        return f"backend={event.backend} worker={event.worker} model={event.model}{extra}{again}"
    if isinstance(event, Rendered):
        return f"prompt_tokens={event.prompt_tokens} digest={event.prompt_digest[:12]} stop_ids={event.stop_ids}" + (
            " constrained" if event.constraint else ""
        )
    if isinstance(event, Counted):
        return f"input_tokens={event.input_tokens}"
    if isinstance(event, Rejected):
        return f"{event.status} {event.error_type}{_code(event.code)}: {_clip(event.message)}"
    if isinstance(event, Error):
        return f"[{event.stage}] {event.status} {event.error_type}{_code(event.code)}: {_clip(event.message)}"
    if isinstance(event, McpConnect | ModelCall | ModelResult | McpCall | McpResult | StreamOpened):
        return _describe_mcp(event)
    if isinstance(event, Completed):
        parts = [f"{event.status} in {event.duration_ms:.1f}ms"]
        if event.stop_reason:
            parts.append(f"stop={event.stop_reason}")
        if event.usage:
            parts.append(f"tokens={event.usage.get('input_tokens')}/{event.usage.get('output_tokens')}")
        parts.append(f"sent={event.bytes_sent}B")
        if event.disconnected:
            parts.append("DISCONNECTED")
        return " ".join(parts)
    if isinstance(event, Admission):
        parts = [f"{event.gate} {event.decision}"]
        if event.queued_ms:
            parts.append(f"queued={event.queued_ms:.1f}ms")
        if event.reserved_tokens is not None:
            parts.append(f"reserved={event.reserved_tokens}")
        if event.prompt_usd is not None:
            parts.append(f"{'reserved' if event.decision == 'admitted' else 'asked'}=${event.prompt_usd:.6f}")
        if event.retry_after is not None:
            parts.append(f"retry_after={event.retry_after}s")
        if event.tenant:
            parts.append(f"tenant={event.tenant}")
        return " ".join(parts)
    if isinstance(event, Settled):
        line = (
            f"{event.delta:+d} tokens (input={event.input_tokens} output={event.output_tokens}"
            f" reserved={event.reserved_tokens})"
        )
        if event.delta_usd is not None:
            cost, reserved = event.cost_usd or 0.0, event.reserved_usd or 0.0
            line += f" {_signed_usd(event.delta_usd)} (cost=${cost:.6f} reserved=${reserved:.6f})"
        return f"{line} tenant={event.tenant}"
    return _clip(repr(event.to_dict()))


def _describe_mcp(event: Event) -> str:
    if isinstance(event, McpConnect):
        if event.ok:
            tools = ", ".join(event.tools) or "no tools"
            return f"{event.server} {event.url} ok in {event.duration_ms:.1f}ms: {_clip(tools)}"
        return f"{event.server} {event.url} FAILED in {event.duration_ms:.1f}ms: {_clip(event.error or '')}"
    if isinstance(event, ModelCall):
        sent = "request" if event.request is not None else f"+{len(event.added)} messages"
        stream = " stream" if event.stream else ""
        return f"round {event.round}{stream} {sent} tools={len(event.tools)}"
    if isinstance(event, ModelResult):
        usage = event.usage or {}
        calls = f" calls={','.join(event.tool_uses)}" if event.tool_uses else ""
        return (
            f"round {event.round} {event.status} in {event.duration_ms:.1f}ms stop={event.stop_reason}"
            f" tokens={usage.get('input_tokens')}/{usage.get('output_tokens')}{calls}"
        )
    if isinstance(event, McpCall):
        verdict = "" if event.allowed else " DENIED by policy"
        args = _clip(repr(event.input), 40)
        return f"round {event.round} {event.server}.{event.tool} {event.id} {args}{verdict}"
    if isinstance(event, McpResult):
        outcome = "error" if event.is_error else "ok"
        return (
            f"round {event.round} {event.server}.{event.tool} {outcome} in {event.duration_ms:.1f}ms"
            f" {_clip(repr(event.content), 40)}"
        )
    return "SSE response started"


def _describe_block(payload: dict[str, Any]) -> str:
    kind = str(payload.get("type"))
    if kind == "message_start":
        message = payload.get("message") or {}
        usage = message.get("usage") or {}
        return f"{kind} {message.get('id', '')} input_tokens={usage.get('input_tokens')}"
    if kind == "content_block_start":
        block = payload.get("content_block") or {}
        name = f" {block['name']}" if block.get("name") else ""
        return f"{kind} #{payload.get('index')} {block.get('type')}{name}"
    if kind == "content_block_delta":
        delta = payload.get("delta") or {}
        dtype = delta.get("type", "")
        text = next(
            (delta[k] for k in ("text", "thinking", "partial_json", "signature") if k in delta),
            "",
        )
        parts = [f"{kind} #{payload.get('index')}", dtype, _clip(repr(text))]
        return " ".join(p for p in parts if p)
    if kind == "content_block_stop":
        return f"{kind} #{payload.get('index')}"
    if kind == "message_delta":
        delta = payload.get("delta") or {}
        usage = payload.get("usage") or {}
        return f"{kind} stop={delta.get('stop_reason')} output_tokens={usage.get('output_tokens')}"
    if kind == "error":
        error = payload.get("error") or {}
        return f"{kind} {error.get('type')}: {_clip(str(error.get('message', '')))}"
    return kind


def _signed_usd(dollars: float) -> str:
    return f"{'-' if dollars < 0 else '+'}${abs(dollars):.6f}"


def _code(code: str | None) -> str:
    return f" ({code})" if code else ""


def _clip(text: str, limit: int = _PREVIEW) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
