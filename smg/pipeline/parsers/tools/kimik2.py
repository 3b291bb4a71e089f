"""The Kimi-K2 tool-call format (behaviors.md §F.8 `kimik2`):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(written on one line).

The call id `functions.{name}:{n}` is the tool_use id, unchanged (§C.2). The arguments object
streams as it arrives. The singular `<|tool_call_section_begin|>` spelling, a call without the
section marker and missing closing markers are accepted.
"""

from __future__ import annotations

import re

from smg.pipeline.parsers.tools.base import ToolParser

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_BEGIN_ALT = "<|tool_call_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
SECTION_END_ALT = "<|tool_call_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

_ID = re.compile(r"[\w.\-:]{1,300}")
_ID_PARTS = re.compile(r"(?:functions\.)?([\w.\-]+):\d+")


class KimiK2Parser(ToolParser):
    name = "kimik2"
    start_markers = (SECTION_BEGIN, SECTION_BEGIN_ALT, CALL_BEGIN)
    block_end = SECTION_END
    _id = ""  # of the call being read
    _name = ""

    def _open(self, marker: str) -> None:
        self.mode = "head" if marker == CALL_BEGIN else "section"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "args":
            if not self._step_args():
                return False
            self.mode = "section"
            return True
        if mode == "head":
            call_id = self._name_then(_ID, ARGS_BEGIN)
            if call_id is None:
                return False
            match = _ID_PARTS.fullmatch(call_id)
            if not match:
                self._broken()
                return True
            self._id, self._name = call_id, match.group(1)
            self.mode = "open_args"
            return True
        if mode == "open_args":
            return self._step_open_args(self._name, self._id)
        # "section": between calls
        if not self._skip_ws():
            return False
        return self._step_between_calls(CALL_BEGIN, CALL_END, SECTION_END, SECTION_END_ALT)
