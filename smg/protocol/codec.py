"""JSON in and out of the gateway, keeping the values clients send.

orjson on the fast path; the standard library when the text holds an integer literal of 20 or
more digits, which orjson would turn into a float but a client may legitimately send (and a
relay must forward unchanged). Non-finite literals (`NaN`, `Infinity`) are not JSON and are
refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson


class BodyDecodeError(ValueError):
    """The bytes are not a JSON document."""


def _refuse_constant(name: str) -> Any:
    raise BodyDecodeError(f"{name} is not valid JSON")


_LONG_INTEGER = re.compile(rb"\d{20}")


def loads(data: bytes) -> Any:
    if not _LONG_INTEGER.search(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
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
