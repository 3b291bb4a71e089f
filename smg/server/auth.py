"""Gateway authentication: `Authorization: Bearer <key>` when `--api-key` is set.

`x-api-key` is never read: it belongs to the Anthropic API and is passed upstream on that
backend only. A client that sends only `x-api-key` is told where the gateway key goes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from smg.protocol.errors import ApiError

_CHALLENGE = 'Bearer realm="data-plane"'


def tenant_of(api_key: str | None, headers: Mapping[str, str], client_ip: str | None) -> str:
    """Who is asking, for the journal: the key's fingerprint when auth is on, else the client IP."""
    if api_key:
        token = _bearer(headers.get("authorization"))
        if token:
            return "auth:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    return f"ip:{client_ip}" if client_ip else "anonymous"


def _bearer(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def check_bearer(api_key: str | None, headers: Mapping[str, str]) -> None:
    """Raise 401 unless the request carries the gateway key."""
    if not api_key:
        return
    token = _bearer(headers.get("authorization"))
    if token is None:
        hint = (
            " This request carried only `x-api-key`, which the gateway does not read; "
            "the gateway key goes in `Authorization: Bearer <key>`."
            if headers.get("x-api-key")
            else ""
        )
        raise ApiError(
            401,
            "Missing API key: send it as `Authorization: Bearer <key>`." + hint,
            code="invalid_api_key",
            minted=False,
            headers={"WWW-Authenticate": _CHALLENGE},
        )
    if not hmac.compare_digest(hashlib.sha256(token.encode()).digest(), hashlib.sha256(api_key.encode()).digest()):
        raise ApiError(
            401,
            "Invalid API key",
            code="invalid_api_key",
            minted=False,
            headers={"WWW-Authenticate": _CHALLENGE + ', error="invalid_token"'},
        )
