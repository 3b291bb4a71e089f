"""Which request headers reach a worker, and which response headers reach the client."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from smg.protocol.headers import is_forwarded, is_gateway_key, outgoing_value
from smg.protocol.hops import HOP_HEADER, outgoing_hops

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-encoding",
        "content-length",
        "host",
        "x-smg-error-code",  # only ever names codes the gateway minted itself
        HOP_HEADER,  # between gateways and workers only
    }
)


def forwarded_request_headers(
    headers: Mapping[str, str], gateway_key: str | None = None, instance_id: str | None = None
) -> dict[str, str]:
    """The allowlisted client headers for an HTTP/PD worker; `Content-Type` is set by us, and
    the hop header (the chain the request came with, then `instance_id`) when given.

    The gateway's own key is not the worker's business: an `Authorization` carrying it is left
    out (a client's other credential passes). A value that cannot go out as sent is left out or
    refused (`outgoing_value`). Raises `ApiError` (400).
    """
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if not is_forwarded(key) or (key == "authorization" and is_gateway_key(value, gateway_key)):
            continue
        sent = outgoing_value(key, value)
        if sent is not None:
            out[key] = sent
    out["content-type"] = "application/json"
    if instance_id is not None:
        out[HOP_HEADER] = outgoing_hops(headers, instance_id)
    return out


def relayed_response_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """A worker's response headers minus hop-by-hop ones."""
    return {k.lower(): v for k, v in headers if k.lower() not in _HOP_BY_HOP}


def with_worker_key(headers: dict[str, str], api_key: str | None) -> dict[str, str]:
    """The client's `Authorization` when it sent one, else the worker's own key when it has one."""
    if api_key is None or "authorization" in headers:
        return headers
    return {**headers, "authorization": f"Bearer {api_key}"}
