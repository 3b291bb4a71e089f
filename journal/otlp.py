"""A journaled request as OpenTelemetry spans, in the OTLP/JSON encoding.

`spans(row, raw)` gives one `ExportTraceServiceRequest` document per request, which is the
line format the OpenTelemetry Collector's `otlpjsonfile` receiver reads (one JSON document per
line), and what trace viewers import. The spans:

* the request (`POST /v1/messages`, kind SERVER) from arrival to `completed`, with the
  summary as attributes (`gen_ai.*` semantic conventions for model, usage and stop reason);
* a child per stage: `validate` (arrival to `validated`/`rejected`), `route` per attempt
  (to each `routed`), `upstream` (the last `routed` to the end, with a `first_token` event at
  the first upstream/block event), and an `exception` event for each `error`.

The trace id is the one the client's `traceparent` carried (so the spans join the client's
trace, under the client's span), else one derived from the gateway's request id. Span ids are
derived from the request id and the stage, so exporting twice gives the same ids.
"""

from __future__ import annotations

import hashlib
from typing import Any

RawEvent = tuple[int, str, float, dict[str, Any]]

_SERVER, _INTERNAL = 2, 1
_OK, _ERROR = 1, 2


def _hex(seed: str, digits: int) -> str:
    return hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()[:digits]


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(pairs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in pairs.items() if v is not None]


def _parent(headers: dict[str, str]) -> str | None:
    for name, value in headers.items():
        if name.lower() == "traceparent":
            parts = value.strip().split("-")
            if len(parts) >= 4 and len(parts[2]) == 16:
                return parts[2].lower()
    return None


def spans(row: dict[str, Any], raw: list[RawEvent], *, service: str = "smg") -> dict[str, Any]:
    """One request's spans as an OTLP/JSON `ExportTraceServiceRequest` (see the module docstring)."""
    request_id = str(row["id"])
    start_ns = int(float(row.get("ts") or 0.0) * 1e9)
    trace_id = row.get("trace_id") or _hex(f"trace:{request_id}", 32)
    root_id = _hex(f"span:{request_id}", 16)

    def at(t: float) -> str:
        return str(start_ns + int(t * 1e9))

    received = next((data for _, kind, _, data in raw if kind == "received"), {})
    end_t = max((t for _, _, t, _ in raw), default=0.0)
    completed = next((data for _, kind, _, data in raw if kind == "completed"), None)
    if completed is not None and isinstance(completed.get("duration_ms"), int | float):
        end_t = max(end_t, completed["duration_ms"] / 1000.0)
    failed = (row.get("status") or 0) >= 400 or row.get("error_type") is not None

    out: list[dict[str, Any]] = []

    def span(name: str, begin: float, end: float, *, attrs: dict[str, Any] | None = None, events: Any = None) -> None:
        out.append(
            {
                "traceId": trace_id,
                "spanId": _hex(f"span:{request_id}:{name}:{len(out)}", 16),
                "parentSpanId": root_id,
                "name": name,
                "kind": _INTERNAL,
                "startTimeUnixNano": at(begin),
                "endTimeUnixNano": at(max(begin, end)),
                "attributes": _attributes(attrs or {}),
                "events": events or [],
                "status": {},
            }
        )

    root_events = []
    routed_at = 0.0
    validated_at: float | None = None
    first_at: float | None = None
    for _, kind, t, data in raw:
        if kind in ("validated", "rejected") and validated_at is None:
            validated_at = t
            span("validate", 0.0, t, attrs={"smg.outcome": kind})
        elif kind == "routed":
            span(
                "route",
                validated_at if validated_at is not None else 0.0,
                t,
                attrs={
                    "smg.backend": data.get("backend"),
                    "smg.worker": data.get("worker"),
                    "smg.policy": data.get("policy"),
                    "smg.attempt": data.get("attempt"),
                },
            )
            routed_at = t
        elif kind in ("upstream", "block", "tokens") and first_at is None:
            first_at = t
        elif kind == "error":
            root_events.append(
                {
                    "timeUnixNano": at(t),
                    "name": "exception",
                    "attributes": _attributes(
                        {
                            "exception.type": data.get("error_type"),
                            "exception.message": data.get("message"),
                            "smg.stage": data.get("stage"),
                            "smg.code": data.get("code"),
                        }
                    ),
                }
            )
    if routed_at:
        first = [{"timeUnixNano": at(first_at), "name": "first_token", "attributes": []}] if first_at else []
        span("upstream", routed_at, end_t, attrs={"smg.worker": row.get("worker")}, events=first)
    root = {
        "traceId": trace_id,
        "spanId": root_id,
        "name": f"{received.get('method', 'POST')} {received.get('path', row.get('path') or '')}".strip(),
        "kind": _SERVER,
        "startTimeUnixNano": at(0.0),
        "endTimeUnixNano": at(end_t),
        "attributes": _attributes(
            {
                "smg.request_id": request_id,
                "smg.client_request_id": row.get("client_id"),
                "http.request.method": received.get("method"),
                "url.path": received.get("path"),
                "http.response.status_code": row.get("status"),
                "gen_ai.request.model": row.get("model"),
                "gen_ai.response.finish_reasons": [row["stop_reason"]] if row.get("stop_reason") else None,
                "gen_ai.usage.input_tokens": row.get("input_tokens"),
                "gen_ai.usage.output_tokens": row.get("output_tokens"),
                "smg.tenant": row.get("tenant"),
                "smg.backend": row.get("backend"),
                "smg.worker": row.get("worker"),
                "smg.stream": row.get("stream"),
                "smg.hung_up": bool(row.get("hung_up")) or None,
                "smg.cut_mid_stream": bool(row.get("cut_mid_stream")) or None,
                "smg.error_code": row.get("error_code"),
                "enduser.id": row.get("user_id"),
                "session.id": row.get("session_id"),
            }
        ),
        "events": root_events,
        "status": {"code": _ERROR, "message": str(row.get("error_code") or row.get("error_type") or "")}
        if failed
        else {"code": _OK},
    }
    parent = _parent(received.get("headers") or {}) if row.get("trace_id") else None
    if parent:
        root["parentSpanId"] = parent
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes({"service.name": service})},
                "scopeSpans": [{"scope": {"name": "smg.journal"}, "spans": [root, *out]}],
            }
        ]
    }
