"""The request headers the Anthropic API receives: exactly the client's credentials and API
version/beta selection, plus `Content-Type`. The gateway adds no key and no version of its own,
and never forwards `X-SMG-MCP` or anything else the client sent."""

from __future__ import annotations

from collections.abc import Mapping

FORWARDED = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")
# Only for the gateway's own calls with a registered worker's key (reading its model list).
DEFAULT_VERSION = "2023-06-01"


def upstream_headers(client_headers: Mapping[str, str], *, content_type: bool = True) -> dict[str, str]:
    """The forwarded subset of `client_headers` (names matched in any case)."""
    out: dict[str, str] = {}
    for name, value in client_headers.items():
        key = name.lower()
        if key in FORWARDED and key not in out:
            out[key] = value
    if content_type:
        out["content-type"] = "application/json"
    return out
