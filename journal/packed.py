"""The compact form of a run of a request's streaming events: many events in one journal row.

A streamed answer is a few events per output token (`tokens`, `block` text deltas, or relayed
`upstream` chunks). Stored one JSON row each, that was ~230 bytes per token; the writer instead
packs the consecutive streaming events of one request that reach it in one flush window into one
row of kind `run` (`seq` and `t` of its first event), whose data is:

    text section  b"\\x01".join(pieces) + b"\\x00"     (searchable, see below)
    entries       one per event: tag byte, time offset, fields

Every number is an unsigned LEB128 varint; offsets and signed values are zigzagged. An entry's
time offset is its time minus the previous entry's, both rounded to the microsecond from the
row's `t` (so a run's times are exact to 1 µs; the first event's is exact). Entries:

- `tokens`: the ids packed (count, then each id, zigzagged); the prompt and completion counts omitted when
  they are what the previous `tokens` entry of the row predicts (the same prompt count, the
  completion count grown by this chunk's ids); `finish_reason`/`matched_stop` when set.
- `block` text, thinking and tool-input deltas: the index (omitted when it is the previous
  delta's) and the text as a piece.
- `upstream` chunks of UTF-8 text: the data as a piece.
- anything else of those kinds: its kind and its JSON payload (as `journal.writer.encode` makes
  it) as a piece.

Pieces are spelled as inside a JSON string (orjson's escaping, without the quotes), so they hold
no control character: `\\x01` separates them, `\\x00` ends the section, and the journal's text
search (`journal.query`, which looks for the needle as JSON spells it) reads the section as text
(SQLite's LIKE stops at the NUL) exactly as it read the old one-row-per-event payloads.

Only events whose payload decodes back to the very same dict, keys in the same order, are packed
in their short form, so a rebuilt response is the same bytes; `pack` refuses (ValueError) a run
it cannot represent and the writer stores those events one row each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from journal.events import Event, Tokens, Upstream

RUN_KIND = "run"
"""The `kind` of a row holding packed events."""

PACKABLE = frozenset({"tokens", "block", "upstream"})
"""The kinds a run may hold: the ones a stream has one of per token or per chunk."""

_TOKENS = 1  # prompt/completion as predicted
_TOKENS_FLAGS = 2  # then a flags byte
_DELTA = 3  # text/thinking/tool-input delta at the previous delta's index (+ delta kind below)
_DELTA_AT = 6  # the same with an explicit index
_CHUNK = 9
_GENERIC = 10

_F_PROMPT = 1
_F_COMPLETION = 2
_F_FINISH = 4
_F_STOP_INT = 8
_F_STOP_STR = 16

_DELTAS = (("text_delta", "text"), ("thinking_delta", "thinking"), ("input_json_delta", "partial_json"))
_DELTA_OF = {name: (i, key) for i, (name, key) in enumerate(_DELTAS)}
_TOKENS_KEYS = ("ids", "prompt_tokens", "completion_tokens", "finish_reason", "matched_stop")
_INT64 = 1 << 63
# An `upstream` chunk's payload, in `Event.to_dict` order (`data` is filled in).
_CHUNK_FIELDS: dict[str, Any] = {"part": "chunk", "status": None, "headers": None, "data": "", "encoding": "utf-8"}
_CHUNK_FIELDS["worker"] = None


def _varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _zigzag(value: int) -> int:
    return value << 1 if value >= 0 else ((-value) << 1) - 1


def _token_ids(ids: list[Any]) -> bytes:
    """The ids, each zigzagged (`--journal-bodies redacted` stores every id as -1) and as a
    varint: `_varint(_zigzag(id))` unrolled for the one to three bytes a vocabulary's ids
    take, the per-token path of a generation's journal."""
    out: list[int] = []
    add = out.append
    for token in ids:
        if type(token) is not int:
            raise ValueError("not a packable token id")
        z = token + token if token >= 0 else -token - token - 1
        if z < 0x80:
            add(z)
        elif z < 0x4000:
            add(z & 0x7F | 0x80)
            add(z >> 7)
        elif z < 0x200000:
            add(z & 0x7F | 0x80)
            add((z >> 7) & 0x7F | 0x80)
            add(z >> 14)
        else:
            if not -_INT64 <= token < _INT64:
                raise ValueError("not a packable token id")
            while z > 0x7F:
                add(z & 0x7F | 0x80)
                z >>= 7
            add(z)
    return bytes(out)


def _unzigzag(value: int) -> int:
    return value >> 1 if not value & 1 else -((value + 1) >> 1)


def _piece(text: str) -> bytes:
    return orjson.dumps(text)[1:-1]  # raises on text UTF-8 cannot hold: the run is refused


def _uint(value: Any) -> int:
    if type(value) is not int or not 0 <= value < _INT64:
        raise ValueError("not a packable count")
    return value


def _short_delta(payload: dict[str, Any]) -> tuple[int, int, str] | None:
    """`(delta kind, index, text)` when `payload` is exactly a delta the short form rebuilds."""
    if len(payload) != 3 or payload.get("type") != "content_block_delta":
        return None
    if list(payload) != ["type", "index", "delta"]:
        return None
    index, delta = payload["index"], payload["delta"]
    if type(index) is not int or not 0 <= index < _INT64 or type(delta) is not dict or len(delta) != 2:
        return None
    found = _DELTA_OF.get(delta.get("type"))  # type: ignore[arg-type]
    if found is None:
        return None
    which, key = found
    keys = list(delta)
    if keys != ["type", key] or type(delta[key]) is not str:
        return None
    return which, index, delta[key]


def pack(events: Sequence[Event], t0: float, encode: Callable[[Event], bytes]) -> bytes:
    """The data of a `run` row holding `events` (consecutive seqs of one request; `t0` is the
    row's `t`, the first event's). `encode` makes a generic entry's JSON payload. Raises
    ValueError for a run the format cannot hold."""
    pieces: list[bytes] = []
    body = bytearray()
    prev_us = 0
    prompt: int | None = None
    completion: int | None = None
    index = 0
    for event in events:
        us = round((event.t - t0) * 1e6)
        kind = event.kind
        if kind == "tokens":
            assert isinstance(event, Tokens)
            ids = event.ids
            flags = 0
            predicted = None if completion is None else completion + len(ids)
            if event.prompt_tokens != prompt:
                flags |= _F_PROMPT
            if event.completion_tokens != predicted:
                flags |= _F_COMPLETION
            if event.finish_reason is not None:
                flags |= _F_FINISH
            stop = event.matched_stop
            if stop is not None:
                if type(stop) is int:
                    if not -_INT64 <= stop < _INT64:
                        raise ValueError("matched_stop out of range")
                    flags |= _F_STOP_INT
                elif type(stop) is str:
                    flags |= _F_STOP_STR
                else:
                    raise ValueError("matched_stop of an unknown type")
            if type(ids) is not list:
                raise ValueError("ids is not a list")
            body.append(_TOKENS_FLAGS if flags else _TOKENS)
            _varint(body, _zigzag(us - prev_us))
            if flags:
                body.append(flags)
            _varint(body, len(ids))
            body += _token_ids(ids)
            if flags & _F_PROMPT:
                _varint(body, 0 if event.prompt_tokens is None else _uint(event.prompt_tokens) + 1)
            if flags & _F_COMPLETION:
                _varint(body, 0 if event.completion_tokens is None else _uint(event.completion_tokens) + 1)
            if flags & _F_FINISH:
                _text(body, event.finish_reason)
            if flags & _F_STOP_INT:
                _varint(body, _zigzag(stop))  # type: ignore[arg-type]
            elif flags & _F_STOP_STR:
                _text(body, stop)
            prompt, completion = event.prompt_tokens, event.completion_tokens
        elif kind == "block" and (short := _short_delta(event.event)) is not None:  # type: ignore[attr-defined]
            which, at, text = short
            piece = _piece(text)
            if at == index:
                body.append(_DELTA + which)
                _varint(body, _zigzag(us - prev_us))
            else:
                body.append(_DELTA_AT + which)
                _varint(body, _zigzag(us - prev_us))
                _varint(body, at)
                index = at
            pieces.append(piece)
        elif (
            kind == "upstream"
            and isinstance(event, Upstream)
            and event.part == "chunk"
            and event.encoding == "utf-8"
            and event.status is None
            and event.headers is None
            and event.worker is None
            and type(event.data) is str
        ):
            pieces.append(_piece(event.data))
            body.append(_CHUNK)
            _varint(body, _zigzag(us - prev_us))
        elif kind in PACKABLE:
            payload = encode(event)
            if b"\x00" in payload or b"\x01" in payload:  # raw control bytes: not in orjson's output
                raise ValueError("payload holds control bytes")
            pieces.append(payload)
            body.append(_GENERIC)
            _varint(body, _zigzag(us - prev_us))
            _text(body, kind)
        else:
            raise ValueError(f"{kind} events are not packed")
        prev_us = us
    # One join: the text section and the entries are not copied again to be put together.
    parts: list[bytes | bytearray] = []
    for piece in pieces:
        parts += (piece, b"\x01")
    if parts:
        parts[-1] = b"\x00"
    else:
        parts.append(b"\x00")
    parts.append(body)
    return b"".join(parts)


def _text(out: bytearray, text: Any) -> None:
    if type(text) is not str:
        raise ValueError("not a string")
    data = text.encode("utf-8")  # raises on lone surrogates: the run is refused
    _varint(out, len(data))
    out += data


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def varint(self) -> int:
        data, pos = self.data, self.pos
        byte = data[pos]
        pos += 1
        if byte < 0x80:
            self.pos = pos
            return byte
        value = byte & 0x7F
        shift = 7
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7

    def text(self) -> str:
        size = self.varint()
        start = self.pos
        self.pos = start + size
        return self.data[start : self.pos].decode("utf-8")


def _unpiece(piece: bytes) -> str:
    text: str = orjson.loads(b'"' + piece + b'"')
    return text


def unpack(seq: int, t0: float, data: bytes) -> list[tuple[int, str, float, dict[str, Any]]]:
    """`(seq, kind, t, payload)` of each event a `run` row holds, payloads as `Event.to_dict`
    gives them."""
    end = data.index(b"\x00")
    pieces = data[:end].split(b"\x01") if end else []
    reader = _Reader(data, end + 1)
    out: list[tuple[int, str, float, dict[str, Any]]] = []
    us = 0
    prompt: int | None = None
    completion: int | None = None
    index = 0
    next_piece = 0
    size = len(data)
    while reader.pos < size:
        tag = data[reader.pos]
        reader.pos += 1
        us += _unzigzag(reader.varint())
        t = t0 + us / 1e6 if us else t0
        if tag == _TOKENS or tag == _TOKENS_FLAGS:
            flags = data[reader.pos] if tag == _TOKENS_FLAGS else 0
            reader.pos += tag == _TOKENS_FLAGS
            ids = [_unzigzag(reader.varint()) for _ in range(reader.varint())]
            completion = None if completion is None else completion + len(ids)
            if flags & _F_PROMPT:
                prompt = reader.varint() - 1
                prompt = None if prompt < 0 else prompt
            if flags & _F_COMPLETION:
                completion = reader.varint() - 1
                completion = None if completion < 0 else completion
            finish = reader.text() if flags & _F_FINISH else None
            stop: int | str | None = None
            if flags & _F_STOP_INT:
                stop = _unzigzag(reader.varint())
            elif flags & _F_STOP_STR:
                stop = reader.text()
            values = (ids, prompt, completion, finish, stop)
            out.append((seq, "tokens", t, dict(zip(_TOKENS_KEYS, values, strict=True))))
        elif _DELTA <= tag < _DELTA_AT + len(_DELTAS):
            if tag >= _DELTA_AT:
                index = reader.varint()
                name, key = _DELTAS[tag - _DELTA_AT]
            else:
                name, key = _DELTAS[tag - _DELTA]
            text = _unpiece(pieces[next_piece])
            next_piece += 1
            delta = {"type": "content_block_delta", "index": index, "delta": {"type": name, key: text}}
            out.append((seq, "block", t, {"event": delta}))
        elif tag == _CHUNK:
            data_text = _unpiece(pieces[next_piece])
            next_piece += 1
            chunk = dict(_CHUNK_FIELDS, data=data_text)
            out.append((seq, "upstream", t, chunk))
        elif tag == _GENERIC:
            kind = reader.text()
            generic: dict[str, Any] = orjson.loads(pieces[next_piece])
            next_piece += 1
            out.append((seq, kind, t, generic))
        else:
            raise ValueError(f"unknown entry tag {tag} in a packed run")
        seq += 1
    return out


def count(data: bytes) -> int:
    """How many events a `run` row holds."""
    return len(unpack(0, 0.0, data))
