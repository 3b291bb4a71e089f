"""The Step3 tool-call format (behaviors.md §F.8 `step3`; StepFun Step-3):

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">
    <steptml:parameter name="city">Paris</steptml:parameter>
    </steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>

(the markers are written with a full-width `｜` and a plain `_`, unlike DeepSeek's). One block
holds one call per `<｜tool_call_begin｜>`; the only call type is `function`. Values are written
raw (a `<` stays a `<`), converted by the tool's schema (values.py); declared strings stream. A
call without the block's opening marker is accepted, as are missing closing markers. The
reasoning before the calls (`<think>`…`</think>`) is the `step3` reasoning parser's.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.xmlish import NAME, XmlCallParser

CALLS_BEGIN = "<｜tool_calls_begin｜>"
CALLS_END = "<｜tool_calls_end｜>"
CALL_BEGIN = "<｜tool_call_begin｜>"
CALL_END = "<｜tool_call_end｜>"
SEP = "<｜tool_sep｜>"
INVOKE = "<steptml:invoke"
END_INVOKE = "</steptml:invoke>"
PARAMETER = "<steptml:parameter"
END_PARAMETER = "</steptml:parameter>"


class Step3Parser(XmlCallParser):
    name = "step3"
    start_markers = (CALLS_BEGIN, CALL_BEGIN)
    value_ends = (END_PARAMETER, PARAMETER, END_INVOKE, CALL_END, CALLS_END)
    block_end = CALLS_END

    def _open(self, marker: str) -> None:
        self.mode = "head" if marker == CALL_BEGIN else "block"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "value":
            return self._step_value()
        if mode == "head":
            kind = self._name_then(NAME, SEP)
            if kind is None:
                return False
            if kind != "function":
                self._broken()
            else:
                self.mode = "invoke"
            return True
        if mode == "invoke_name" or mode == "parameter":
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
        if mode == "invoke":
            found = self._expect(INVOKE)
            if found == "":
                return False
            if found is None:
                self._broken()
            else:
                self.mode = "invoke_name"
            return True
        if mode == "params":
            found = self._expect(PARAMETER, END_INVOKE, CALL_END, CALLS_END)
            if found == "":
                return False
            if found == PARAMETER:
                self.mode = "parameter"
                return True
            if found is None:
                self._garbage()
                return True
            self._close_xml_call()
            self.mode = "call_end" if found == END_INVOKE else "block" if found == CALL_END else TEXT
            return True
        # "block" (between calls) and "call_end" (after `</steptml:invoke>`)
        found = self._expect(CALL_BEGIN, CALLS_END, CALL_END)
        if found == "":
            return False
        if found == CALL_BEGIN:
            self.mode = "head"
        elif found == CALLS_END:
            self._end_block()
        elif found == CALL_END and self._committed:
            self._raw = []  # the finished call's closing marker
            self.mode = "block"
        else:
            self._broken()
        return True
