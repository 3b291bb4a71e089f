"""The Mistral tool-call formats (behaviors.md §F.8 `mistral`).

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

the JSON array of the v0.3 chat template (the space after the marker is optional; a single
object without the array is accepted too), and the newer tokenizers' one-call-per-marker form

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}

The arguments object streams as it arrives. Ids the model writes (`"id"`, `[CALL_ID]`) are
Mistral's own 9-character ids, not the client's: the tool_use ids are generated.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.jsoncalls import JsonCallsParser
from smg.pipeline.parsers.tools.xmlish import NAME

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


class MistralParser(JsonCallsParser):
    name = "mistral"
    start_markers = (TOOL_CALLS,)
    _name = ""  # of the call being read (the one-call-per-marker form)

    def _open(self, marker: str) -> None:
        self.mode = "head"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "args":
            if not self._step_args():
                return False
            self.mode = TEXT
            return True
        if mode == "name":
            return self._step_name()
        if mode == "call_id":
            found = self._read_until((ARGS,), limit=64)
            if found is None:
                return False
            if not found[1]:
                self._fail()
            else:
                self.mode = "open_args"
            return True
        if mode == "open_args":
            return self._step_open_args(self._name)
        return self._step_call_objects()

    def _head_other(self) -> None:
        self.mode = "name"  # the one-call-per-marker form

    def _step_name(self) -> bool:
        match = NAME.match(self._buf)
        length = match.end() if match else 0
        rest = self._buf[length:]
        if not rest:
            return False
        for marker in (ARGS, CALL_ID):
            if rest.startswith(marker) and length:
                self._name = self._consume(length)
                self._consume(len(marker))
                self.mode = "open_args" if marker == ARGS else "call_id"
                return True
            if marker.startswith(rest) and length:
                return False
        self._fail()
        return True
