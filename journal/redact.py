"""Secrets never reach the journal in clear.

A secret is replaced by `[redacted sha256:<12 hex>]`: the first 12 hex digits of the SHA-256
of the value, so an operator can tell two keys apart (or match one they hold) without the
journal storing anything usable. `redacted(event)` is applied once, by the writer, before an
event is queued: whoever emits events needs no redaction of their own. The functions are
idempotent (a redacted value is left as it is).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from journal.events import Event, Received, Upstream, Validated

SECRET_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie"})
_PREFIX = "[redacted sha256:"
_TOKEN_KEY = "authorization_token"


def redact_value(value: str) -> str:
    """The redacted form of one secret value (unchanged if already redacted)."""
    if value.startswith(_PREFIX):
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{_PREFIX}{digest}]"


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A copy of `headers` with the values of secret headers (any case) redacted."""
    return {name: redact_value(value) if name.lower() in SECRET_HEADERS else value for name, value in headers.items()}


def redact_body(text: str) -> str:
    """`text` with every `mcp_servers[].authorization_token` value redacted.

    Bodies without the key (nearly all) cost one substring search. The token's JSON string
    is replaced in place so the rest of the body stays byte-for-byte as the client sent it;
    only when a token is spelled with escapes that prevent that is the body re-serialized.
    Text that is not JSON is returned unchanged.
    """
    if _TOKEN_KEY not in text:
        return text
    try:
        body = json.loads(text)
    except ValueError:
        return text
    servers = body.get("mcp_servers") if isinstance(body, dict) else None
    if not isinstance(servers, list):
        return text
    tokens = [
        s[_TOKEN_KEY]
        for s in servers
        if isinstance(s, dict) and isinstance(s.get(_TOKEN_KEY), str) and not s[_TOKEN_KEY].startswith(_PREFIX)
    ]
    if not tokens:
        return text
    out = text
    for token in tokens:
        spellings = {json.dumps(token), json.dumps(token, ensure_ascii=False)}
        found = [q for q in spellings if q in out]
        if not found:
            return _reserialize(body)
        for quoted in found:
            out = out.replace(quoted, json.dumps(redact_value(token)))
    return out


def _reserialize(body: dict[str, Any]) -> str:
    for server in body["mcp_servers"]:
        if isinstance(server, dict) and isinstance(server.get(_TOKEN_KEY), str):
            server[_TOKEN_KEY] = redact_value(server[_TOKEN_KEY])
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def _redact_tokens(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: redact_value(v) if k == _TOKEN_KEY and isinstance(v, str) else _redact_tokens(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact_tokens(v) for v in value]
    return value


def redacted(event: Event) -> Event:
    """The event as the journal may keep it: a copy with its secrets redacted (the caller's
    event is left alone, e.g. an upstream head whose headers the response still needs), or
    the event itself when it carries none."""
    if isinstance(event, Received):
        return replace(
            event,
            headers=redact_headers(event.headers),
            body=redact_body(event.body) if event.body else event.body,
        )
    if isinstance(event, Upstream) and event.headers:
        return replace(event, headers=redact_headers(event.headers))
    if isinstance(event, Validated) and event.summary:
        return replace(event, summary=_redact_tokens(event.summary))
    return event
