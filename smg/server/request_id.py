"""The ids of each request.

The gateway mints an id for every request (`msg_…` for `/v1/messages`, `req_…` elsewhere):
the journal's key, so that two requests are never one record. The client's own id (the first
of the configured headers that carries one) is kept beside it and echoed in `x-request-id`,
`request-id` and every error envelope's `request_id`; a request without one is given the
minted id. A client id that cannot be echoed as sent (bytes that are not UTF-8, control
characters) is not used: the client is given the minted id, and the journal keeps the header
as received (escaped) among the request's headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from smg.protocol.ids import random_id


def new_id(prefix: str) -> str:
    return random_id(prefix)


@dataclass(frozen=True, slots=True)
class RequestIds:
    key: str
    """The gateway's id: the journal's key for the request."""
    client: str | None
    """The id the client sent, when it can be echoed."""

    @property
    def echoed(self) -> str:
        """The id the client is given back."""
        return self.client or self.key


def _usable(value: str) -> bool:
    if value.isascii():
        return value.isprintable()
    try:
        value.encode("utf-8")  # Sanic decodes header bytes with surrogateescape
    except UnicodeEncodeError:
        return False
    return value.isprintable()


def resolve_request_ids(path: str, headers: Mapping[str, str], names: Iterable[str]) -> RequestIds:
    key = new_id("msg_" if path.rstrip("/") == "/v1/messages" else "req_")
    for name in names:
        value = headers.get(name)
        if value and value.strip():
            value = value.strip()
            return RequestIds(key, value if _usable(value) else None)
    return RequestIds(key, None)


def resolve_request_id(path: str, headers: Mapping[str, str], names: Iterable[str]) -> str:
    """The id echoed to the client (see `resolve_request_ids`)."""
    return resolve_request_ids(path, headers, names).echoed
