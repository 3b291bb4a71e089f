"""The request headers the spec lets an HTTP or PD worker see (the forwarded-headers table).

A fact of the Messages surface, not of one backend: the relay forwards exactly these, and a
replay re-sends no others.
"""

from __future__ import annotations

FORWARDED_REQUEST_HEADERS = frozenset(
    {
        "authorization",
        "anthropic-version",
        "anthropic-beta",
        "x-request-id",
        "x-correlation-id",
        "traceparent",
        "tracestate",
        "x-smg-routing-key",
    }
)


def is_forwarded(name: str) -> bool:
    """Whether a (lower-case) request header name reaches an HTTP worker."""
    return name in FORWARDED_REQUEST_HEADERS or name.startswith("x-request-id-")
