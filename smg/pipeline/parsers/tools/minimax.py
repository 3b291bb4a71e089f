"""The MiniMax-M2 tool-call format (behaviors.md §F.8 `minimax_m2`):

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

One block may hold several `<invoke>`s, each a call. Values are XML-escaped (`&lt;` …), so
they are unescaped, then converted by the tool's schema (values.py); being unescaped, they are
read whole rather than streamed.
"""

from __future__ import annotations

import re

from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.xmlish import NAME, XmlCallParser

START = "<minimax:tool_call>"
END = "</minimax:tool_call>"
INVOKE = "<invoke"
END_INVOKE = "</invoke>"
PARAMETER = "<parameter"
END_PARAMETER = "</parameter>"

_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos);")
_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}


class MinimaxM2Parser(XmlCallParser):
    name = "minimax_m2"
    start_markers = (START,)
    value_ends = (END_PARAMETER, PARAMETER, END_INVOKE, END)
    block_end = END
    stream_strings = False

    def _open(self, marker: str) -> None:
        self.mode = "block"

    def _decode(self, text: str) -> str:
        return _ENTITY.sub(lambda match: _ENTITIES[match.group(1)], text)

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "value":
            return self._step_value()
        if mode == "invoke" or mode == "parameter":
            name = self._tag_name()
            if name is None:
                return False
            if mode == "parameter":
                if name:
                    self._start_value(name)
                else:
                    self._garbage(PARAMETER)
            elif NAME.fullmatch(name):
                self._open_xml_call(name)
                self.mode = "params"
            else:
                self._broken()
            return True
        if not self._skip_ws():
            return False
        if mode == "block":
            found = self._expect(INVOKE, END)
            if found == "":
                return False
            if found == INVOKE:
                self.mode = "invoke"
            elif found == END:
                self._end_block()
            else:
                self._broken()
            return True
        # "params": between parameters
        found = self._expect(PARAMETER, END_INVOKE, END)
        if found == "":
            return False
        if found == PARAMETER:
            self.mode = "parameter"
        elif found == END_INVOKE:
            self._close_xml_call()
            self.mode = "block"
        elif found == END:
            self._close_xml_call()
            self.mode = TEXT
        else:
            self._garbage()
        return True

    def _broken(self) -> None:
        if self._committed:
            self._pending_end = END
        self._fail()
