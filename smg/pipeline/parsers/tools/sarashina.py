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

from smg.pipeline.parsers.tools.jsonish import BareJsonParser
from smg.pipeline.parsers.tools.pyliteral import PyLiteralCall

TOOL_CALLS = "<|tool_calls|>"
LIST = "["  # the bare list at the start


class SarashinaParser(BareJsonParser):
    name = "sarashina"
    start_markers = (TOOL_CALLS,)
    bare_opener = LIST

    def _open(self, marker: str) -> None:
        self._bare = marker == LIST
        self.mode = "item" if self._bare else "head"

    def _new_call_object(self) -> None:
        self._json = PyLiteralCall()
