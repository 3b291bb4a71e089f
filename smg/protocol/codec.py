"""JSON in and out of the gateway, keeping the values clients send.

orjson decides what is JSON: its syntax, UTF-8 and surrogate checks and its depth limit (1024)
hold for every body. When the text holds an integer literal of 20 or more digits, which orjson
would turn into a float but a client may legitimately send (and a relay must forward unchanged),
the document orjson accepted is parsed again by the standard library for the exact values; its
own, laxer rules (lone surrogate escapes, its recursion limit) never decide alone. Non-finite
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


# Digits to b"1", every other byte to b"0": a run of 20 digits is then a plain substring search,
# several times faster than a regular expression over a body of megabytes.
_DIGITS = bytes(0x31 if 0x30 <= byte <= 0x39 else 0x30 for byte in range(256))
_RUN = b"1" * 20
# A body of megabytes is translated a window at a time (windows overlap by a run's length less
# one, so a run across two is seen): no pass holds the GIL for longer than one window, and the
# translated copy is one window, not the body.
_WINDOW = 1 << 20


def _has_long_integer(data: bytes) -> bool:
    if len(data) <= _WINDOW:
        return _RUN in data.translate(_DIGITS)
    step = _WINDOW - len(_RUN) + 1
    return any(_RUN in data[at : at + _WINDOW].translate(_DIGITS) for at in range(0, len(data), step))


def loads(data: bytes) -> Any:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BodyDecodeError(str(exc)) from None
    if not _has_long_integer(data):
        return value
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BodyDecodeError(str(exc)) from None
    except RecursionError:
        raise BodyDecodeError("the document is nested too deeply to keep its integers exact") from None


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
