"""JSON in and out of the gateway, keeping the values clients send.

orjson on the fast path; the standard library only for integers beyond 64 bits, which orjson
refuses but a client may legitimately send (and a relay must forward unchanged). Non-finite
literals (`NaN`, `Infinity`) are not JSON and are refused.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


class BodyDecodeError(ValueError):
    """The bytes are not a JSON document."""


def _refuse_constant(name: str) -> Any:
    raise BodyDecodeError(f"{name} is not valid JSON")


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "64-bit" not in str(exc):
            raise BodyDecodeError(str(exc)) from None
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BodyDecodeError(str(exc)) from None


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
