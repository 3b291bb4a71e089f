"""The request headers the spec lets an HTTP or PD worker see (the forwarded-headers table),
and what of a client's header value can go out on the wire.

A fact of the Messages surface, not of one backend: the relay forwards exactly these, and a
replay re-sends no others.

A header value goes out only as visible ASCII (with spaces and tabs): the server decodes the
bytes a client sent as UTF-8 with surrogate escapes, and neither HTTP client the gateway uses
can send anything else. What happens to a value that cannot go out depends on what it is for:
an id or a trace context is informational and is simply not forwarded; a credential or the
API version/beta selection changes the answer, so the request is refused (400) instead of
being sent without it.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from smg.protocol.errors import ApiError

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

# The headers whose value decides how the upstream answers: never dropped silently.
EXACT_HEADERS = frozenset({"authorization", "x-api-key", "anthropic-version", "anthropic-beta"})

_SENDABLE = re.compile(r"[\t\x20-\x7e]*")


def is_forwarded(name: str) -> bool:
    """Whether a (lower-case) request header name reaches an HTTP worker."""
    return name in FORWARDED_REQUEST_HEADERS or name.startswith("x-request-id-")


def sendable(value: str) -> bool:
    """Whether a header value can be sent upstream exactly as the client sent it."""
    return _SENDABLE.fullmatch(value) is not None


def outgoing_value(name: str, value: str) -> str | None:
    """The value to send for a (lower-case) forwarded header, or None to leave it out.

    Raises a 400 `ApiError` for a credential or version header that cannot be sent; the
    message names the header, never its value.
    """
    if sendable(value):
        return value
    if name in EXACT_HEADERS:
        raise ApiError(
            400,
            f"The `{name}` header holds bytes outside visible ASCII; it cannot be sent to the upstream as given",
            code="invalid_header_value",
        )
    return None


def bearer_token(value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def is_gateway_key(authorization: str | None, gateway_key: str | None) -> bool:
    """Whether an `Authorization` value carries the gateway's own `--api-key` (compared in
    constant time): that credential is for the gateway, never for an upstream."""
    token = bearer_token(authorization)
    if not gateway_key or token is None:
        return False
    return hmac.compare_digest(hashlib.sha256(token.encode()).digest(), hashlib.sha256(gateway_key.encode()).digest())
