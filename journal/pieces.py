"""How raw bytes are stored in events: UTF-8 text when they are text, base64 otherwise.

Upstream chunks are journaled as text; a multi-byte character split across two network reads
is carried over to the next piece instead of being stored as undecodable bytes.
"""

from __future__ import annotations

import base64


def _incomplete_tail(buf: bytes) -> int:
    """How many trailing bytes form an unfinished UTF-8 sequence (0–3)."""
    for back in range(1, min(4, len(buf)) + 1):
        byte = buf[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        if byte & 0x80 == 0:
            return 0
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


class TextPieces:
    """Feed bytes, get `(data, encoding)` pieces: UTF-8 text, or base64 for bytes that are not."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> tuple[str, str] | None:
        buf = self._pending + chunk if self._pending else chunk
        cut = len(buf) - _incomplete_tail(buf)
        self._pending = buf[cut:]
        return text_piece(buf[:cut]) if cut else None

    def flush(self) -> tuple[str, str] | None:
        rest, self._pending = self._pending, b""
        return text_piece(rest) if rest else None


def text_piece(data: bytes) -> tuple[str, str]:
    """A whole body as `(data, encoding)`: text when it is UTF-8, else base64."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def piece_bytes(data: str, encoding: str) -> bytes:
    """The exact bytes a piece stands for."""
    return base64.b64decode(data) if encoding == "base64" else data.encode("utf-8")
