"""Gateway-side stop sequences over streamed text (behaviors.md §D.3, §F.4).

Text is released as soon as it can no longer be the start of a stop string; a tail that could
still grow into one is held. The first stop to complete ends the text: what precedes it is
released, the stop string and everything after it never are. "First" is the occurrence that
ends earliest (the longer one on a tie), which makes the result the same however the text is
chunked.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Stop-string matching over a stream of text chunks."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops: list[str] = [s for s in dict.fromkeys(stops) if s]
        self.matched: str | None = None
        self._held = ""
        self._longest = max((len(s) for s in self.stops), default=0)

    def push(self, text: str) -> str:
        """The part of `held + text` that is safe to emit; after a match, always ""."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        hit = self._first_match(buffer)
        if hit is not None:
            start, stop = hit
            self.matched = stop
            self._held = ""
            return buffer[:start]
        keep = self._partial_tail(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """Held text at the end of the stream, which no stop completed."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, -length, stop)
        for stop in self.stops:
            start = buffer.find(stop)
            if start < 0:
                continue
            key = (start + len(stop), -len(stop), stop)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        end, negative_length, stop = best
        return end + negative_length, stop

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest tail of `buffer` that is a proper prefix of some stop."""
        for size in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[-size:]
            if any(len(stop) > size and stop.startswith(tail) for stop in self.stops):
                return size
        return 0
