"""The request headers the Anthropic API receives: exactly the client's credentials and API
version/beta selection, plus `Content-Type`. The gateway adds no key and no version of its own,
and never forwards `X-SMG-MCP` or anything else the client sent."""

from __future__ import annotations

from collections.abc import Mapping

FORWARDED = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")


def upstream_headers(client_headers: Mapping[str, str]) -> dict[str, str]:
    """The forwarded subset of `client_headers` (names matched in any case)."""
    out: dict[str, str] = {}
    for name, value in client_headers.items():
        key = name.lower()
        if key in FORWARDED and key not in out:
            out[key] = value
    out["content-type"] = "application/json"
    return out
