"""The shared machinery of the marker-delimited reasoning parsers (behaviors.md §F.6, §F.8).

A `MarkerParser` is a text stage that splits generated text at a start and an end marker
(`<think>` … `</think>` for most models): text inside reasoning becomes `Thinking` pieces, the
rest `Text`. It works on deltas of any size and gives the same result however the text is cut:

* The markers themselves are never emitted. A delta that ends in what could still become a
  marker holds that tail back until the next delta decides it; at the end of the output a held
  tail is emitted as the kind of the section it was in.
* After an end marker, the answer's leading whitespace (the blank lines of `</think>\\n\\n`) is
  dropped up to its first non-whitespace character.
* A start marker is honoured once per output, as the reference parser does (its
  `stripped_think_start`): the first one — in the output, or already in the prompt when the
  caller says `start_consumed` — opens reasoning (or, met while already in reasoning, is just
  dropped); any later one is literal text of the section it appears in. Text before an honoured
  start marker stays `Text`.
* An end marker outside reasoning is literal text, as in the reference parser.

`thinking.display: "omitted"` is not the parser's business: it emits the thinking text as
always and the block builder keeps the block but not its text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg.pipeline.generation import Piece, Text, Thinking


class MarkerParser:
    """Reasoning between `start` and `end` markers. Subclasses name a model's markers and whether
    its output starts inside reasoning when the prompt says nothing (`default_in_reasoning`)."""

    name: ClassVar[str] = "base"
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    default_in_reasoning: ClassVar[bool] = False
    # Whether the markers are special tokens, kept in the text for this parser (and so read
    # even when thinking is off, as the reference does for such formats).
    special_tokens: ClassVar[bool] = False

    def __init__(self, in_reasoning: bool, *, start_consumed: bool = False) -> None:
        self.in_reasoning = in_reasoning
        self.start_consumed = start_consumed
        self._held = ""
        self._strip_answer = False
        self._leads = self._lead_chars()

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        if len(pieces) == 1 and not self._held and not self._strip_answer:
            # The common case, once per token: one delta in which no marker can begin.
            piece = pieces[0]
            if type(piece) is Text and not any(c in piece.text for c in self._leads):
                return [Thinking(piece.text) if self.in_reasoning else piece] if piece.text else []
        out: list[Piece] = []
        for piece in pieces:
            if isinstance(piece, Text):
                out += self._scan(piece.text)
            else:
                # Another stage's piece breaks the text: what was held can no longer become a marker.
                out += self.flush()
                out.append(piece)
        return out

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        self._emit(self._take_held(), out)
        return out

    def _scan(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        text = self._take_held() + text
        while text:
            markers = self._live_markers()
            if not any(m[0] in text for m in markers):
                # No marker can begin in this text, not even as a held tail: the common case of
                # each token's delta, answered without searching.
                self._emit(text, out)
                break
            hits = [(i, m) for m in markers if (i := text.find(m)) >= 0]
            if hits:
                i, marker = min(hits)
                self._emit(text[:i], out)
                text = text[i + len(marker) :]
                self._emit(self._cross(marker), out)
                continue
            keep = _partial_marker_len(text, markers)
            self._emit(text[: len(text) - keep], out)
            self._held = text[len(text) - keep :]
            break
        return out

    def _live_markers(self) -> list[str]:
        """The markers that would change the state here; only their prefixes are held back."""
        markers = [self.end] if self.in_reasoning else []
        if not self.start_consumed:
            markers.append(self.start)
        return markers

    def _cross(self, marker: str) -> str:
        """Take the state change of `marker`; what it stands for in the new section (markers
        themselves are not text)."""
        if marker == self.end:
            self.in_reasoning = False
            self._strip_answer = True
        else:
            self.start_consumed = True
            self.in_reasoning = True
            self._strip_answer = False
        self._leads = self._lead_chars()
        return ""

    def _lead_chars(self) -> tuple[str, ...]:
        """The first characters of the live markers: text with none of them cannot hold one."""
        return tuple(dict.fromkeys(m[0] for m in self._live_markers()))

    def _take_held(self) -> str:
        held, self._held = self._held, ""
        return held

    def _emit(self, text: str, out: list[Piece]) -> None:
        """Append `text` as the current section's kind, joined to the last piece when that is of
        the same kind (`out` only ever holds this parser's own pieces)."""
        if self._strip_answer:
            text = text.lstrip()
            self._strip_answer = not text
        if not text:
            return
        kind = Thinking if self.in_reasoning else Text
        if out and type(out[-1]) is kind:
            out[-1] = kind(out[-1].text + text)
        else:
            out.append(kind(text))


def _partial_marker_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best
