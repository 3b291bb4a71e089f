"""The id of each request: the client's own (first of the configured headers) or a new one,
`msg_…` for `/v1/messages`, `req_…` elsewhere. It is echoed in `x-request-id` and in every
error envelope's `request_id`."""

from __future__ import annotations

import secrets
import string
from collections.abc import Iterable, Mapping

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    # One urandom call per id (not one per character); the modulo bias is irrelevant for ids.
    return prefix + "".join(_ALPHABET[b % 62] for b in secrets.token_bytes(24))


def resolve_request_id(path: str, headers: Mapping[str, str], names: Iterable[str]) -> str:
    for name in names:
        value = headers.get(name)
        if value and value.strip():
            return value.strip()
    return new_id("msg_" if path.rstrip("/") == "/v1/messages" else "req_")
