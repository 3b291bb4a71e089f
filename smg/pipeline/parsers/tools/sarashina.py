"""The Sarashina tool-call format (behaviors.md §F.8 `sarashina`; SB Intuitions Sarashina):

    <|tool_calls|>[{'name': 'get_weather', 'arguments': {'city': 'Paris'}}]

a Python-literal list of call objects (single quotes, `True`/`False`/`None`; JSON spellings are
read too), after the `<|tool_calls|>` marker — or, since that marker is a special token that a
detokenizer may drop, a bare list opening with `[{` at the start of the output (or right after
another call). After the marker a single object without the list is accepted as well. The
arguments stream as they arrive, converted to JSON (pyliteral.py).

A bare list is no marker, so as with the bare-JSON formats (jsonish.py) its object opens a call
only once it has shown its arguments and — when the request declared tools — a declared name.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools import jsonstream as js
from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.jsonish import BareJsonParser
from smg.pipeline.parsers.tools.pyliteral import PyLiteralCall

TOOL_CALLS = "<|tool_calls|>"
LIST = "["  # the bare list at the start


class SarashinaParser(BareJsonParser):
    name = "sarashina"
    start_markers = (TOOL_CALLS,)

    def _step_text(self) -> bool:
        if self._at_start and self._buf:
            body = self._buf.lstrip(js.WHITESPACE)
            if not body:
                self._text(self._buf)
                self._buf = ""
                return False
            if body[0] == LIST:
                self._text(self._buf[: len(self._buf) - len(body)])
                self._buf = body[1:]
                self._begin(LIST)
                return True
        return super()._step_text()

    def _open(self, marker: str) -> None:
        self._bare = marker == LIST
        self.mode = "item" if self._bare else "head"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "call" or mode == "array":
            outcome = self._step_json()
            if outcome is None:
                return False
            if outcome:
                self.mode = TEXT if mode == "call" else "next"
            return True
        if not self._skip_ws():
            return False
        ch = self._buf[0]
        if mode == "head":
            if ch == LIST:
                self._consume(1)
                self.mode = "item"
            elif ch == "{":
                self._json = PyLiteralCall()
                self.mode = "call"
            else:
                self._fail()
            return True
        if mode == "item":
            if ch != "{":
                self._fail()
                return True
            self._json = PyLiteralCall()
            self.mode = "array"
            return True
        # "next": after an element
        if ch == ",":
            self._consume(1)
            self.mode = "item"
        elif ch == "]":
            self._consume(1)
            self._raw = []
            self.mode = TEXT
        else:
            self._fail()
        return True
