"""The bare-JSON tool-call formats (behaviors.md §F.8 `json`, `llama`).

`json`: a call object `{"name": f, "arguments"|"parameters": {...}}`, or an array of them,
anywhere in the text. This is also the format of `tool_choice: any` under a JSON-schema
constraint (§F.3).

`llama` (Llama 3.x): `<|python_tag|>` followed by call objects separated by `;`, or a plain call
object at the start of the output (or right after another call).

Without a marker, a JSON object in prose is no evidence of a call, so a bare object opens a call
only once it has shown an arguments key and — when the request declared tools — a declared
tool name. Objects that do not qualify stay text, whole.
"""

from __future__ import annotations

from typing import ClassVar

from smg.pipeline.parsers.tools import jsonstream as js
from smg.pipeline.parsers.tools.base import IdFactory, Tools, tool_names
from smg.pipeline.parsers.tools.jsoncalls import JsonCallsParser


class BareJsonParser(JsonCallsParser):
    """Shared: the rule for marker-less call objects, and where a format without its marker
    looks for them."""

    # What opens marker-less calls at the start of the output (or right after a call), if the
    # format has them there: llama's object, sarashina's list.
    bare_opener: ClassVar[str] = ""

    def __init__(self, tools: Tools | None = None, *, new_id: IdFactory | None = None) -> None:
        super().__init__(tools, new_id=new_id)
        self._declared = tool_names(self.tools)
        self._bare = False

    def _accept(self, call: js.JsonCall) -> bool:
        if not self._bare:
            return call.args_started or call.done
        assert call.name is not None
        return call.args_started and (not self._declared or call.name in self._declared)

    def _step_text(self) -> bool:
        if self.bare_opener and self._at_start and self._buf:
            body = self._buf.lstrip(js.WHITESPACE + (self.separators if self._after_call else ""))
            if not body:
                self._text(self._buf)
                self._buf = ""
                return False
            if body[0] == self.bare_opener:
                self._text(self._buf[: len(self._buf) - len(body)])
                self._buf = body[1:]
                self._begin(self.bare_opener)
                return True
        return super()._step_text()

    def _open_bare_object(self) -> None:
        """A marker-less call object: its `{` is read again as the object's own."""
        self._buf = "{" + self._buf
        self._raw = []
        self._start_json()
        self.mode = "call"

    def _step_mode(self) -> bool:
        return self._step_call_objects()


class JsonParser(BareJsonParser):
    name = "json"
    start_markers = ("{", "[")
    separators = ";,"

    def _open(self, marker: str) -> None:
        self._bare = True
        if marker == "{":
            self._open_bare_object()
        else:
            self.mode = "item"


PYTHON_TAG = "<|python_tag|>"


class LlamaParser(BareJsonParser):
    name = "llama"
    start_markers = (PYTHON_TAG,)
    separators = ";"
    bare_opener = "{"

    def _open(self, marker: str) -> None:
        self._bare = marker == "{"
        if marker == "{":
            self._open_bare_object()
        else:
            self.mode = "open"
