"""The request headers the Anthropic API receives: exactly the client's credentials and API
version/beta selection, plus `Content-Type` and the hop header (`smg.protocol.hops`). The
gateway adds no key and no version of its own,
and never forwards `X-SMG-MCP`, its own `--api-key`, or anything else the client sent. Each of
these headers decides the answer, so one that cannot be sent as given refuses the request (400)."""

from __future__ import annotations

from collections.abc import Mapping

from smg.protocol.headers import is_gateway_key, outgoing_value
from smg.protocol.hops import HOP_HEADER, outgoing_hops

FORWARDED = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")
# Only for the gateway's own calls with a registered worker's key (reading its model list).
DEFAULT_VERSION = "2023-06-01"


def upstream_headers(
    client_headers: Mapping[str, str],
    *,
    content_type: bool = True,
    gateway_key: str | None = None,
    instance_id: str | None = None,
) -> dict[str, str]:
    """The forwarded subset of `client_headers` (names matched in any case). Raises `ApiError` (400)."""
    out: dict[str, str] = {}
    for name, value in client_headers.items():
        key = name.lower()
        if key not in FORWARDED or key in out or (key == "authorization" and is_gateway_key(value, gateway_key)):
            continue
        sent = outgoing_value(key, value)
        if sent is not None:
            out[key] = sent
    if content_type:
        out["content-type"] = "application/json"
    if instance_id is not None:
        out[HOP_HEADER] = outgoing_hops(client_headers, instance_id)
    return out
