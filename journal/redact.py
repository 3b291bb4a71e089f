"""Secrets never reach the journal in clear.

A secret is replaced by `[redacted sha256:<12 hex>]`: the first 12 hex digits of the SHA-256
of the value, so an operator can tell two keys apart (or match one they hold) without the
journal storing anything usable. Both functions are idempotent: a redacted value is left as
it is, so redacting at the edge and again in the writer is harmless.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

SECRET_HEADERS = frozenset(
    {"authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie"}
)
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
    return {
        name: redact_value(value) if name.lower() in SECRET_HEADERS else value
        for name, value in headers.items()
    }


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
        if isinstance(s, dict) and isinstance(s.get(_TOKEN_KEY), str)
        and not s[_TOKEN_KEY].startswith(_PREFIX)
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
