"""The Qwen tool-call formats: Hermes-style JSON (`qwen`) and Qwen3-Coder XML (`qwen_xml`).

`qwen` (behaviors.md §F.8):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call. The arguments object streams as it arrives. `parameters` is accepted for
`arguments`. A closing `</tool_call>` may be missing; anything but whitespace between the object
and the closing tag is text.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.jsoncalls import JsonCallsParser
from smg.pipeline.parsers.tools.xmlish import XmlCallParser

START = "<tool_call>"
END = "</tool_call>"


class QwenParser(JsonCallsParser):
    name = "qwen"
    start_markers = (START,)

    def _open(self, marker: str) -> None:
        self.mode = "open"

    def _step_mode(self) -> bool:
        return self._step_call_objects()

    def _calls_done(self) -> None:
        super()._calls_done()
        self._pending_end = END


FUNCTION = "<function="
END_FUNCTION = "</function>"
PARAMETER = "<parameter="
END_PARAMETER = "</parameter>"


class QwenXmlParser(XmlCallParser):
    """Qwen3-Coder / Qwen3.5 / Nemotron-3 (behaviors.md §F.8 `qwen_xml`):

        <tool_call>
        <function=get_weather>
        <parameter=city>
        Paris
        </parameter>
        </function>
        </tool_call>

    A `<function=…>` without the `<tool_call>` before it is accepted too, and so are missing
    `</parameter>` / `</function>` closings."""

    crlf_closing = False  # its template writes "\n" around every value: only that is the template's

    name = "qwen_xml"
    start_markers = (START, FUNCTION)
    value_ends = (END_PARAMETER, PARAMETER, END_FUNCTION, END)
    block_end = END

    def _open(self, marker: str) -> None:
        self.mode = "function" if marker == FUNCTION else "open"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "value":
            return self._step_value()
        if mode == "open":
            if not self._skip_ws():
                return False
            found = self._expect(FUNCTION)
            if found == "":
                return False
            if found is None:
                self._fail()
            else:
                self.mode = "function"
            return True
        if mode == "function":
            name = self._read_name(lambda rest: rest.startswith(">"))
            if name is None:
                return False
            if not name:
                self._fail()
                return True
            self._consume(1)
            self._open_xml_call(name)
            self.mode = "params"
            return True
        if mode == "key":
            read = self._read_until((">",), limit=256)
            if read is None:
                return False
            key, end = read
            if not end or not key.strip():
                self._garbage(PARAMETER + key + end)
                return True
            self._start_value(key.strip())
            return True
        # "params": between parameters
        if not self._skip_ws():
            return False
        found = self._expect(PARAMETER, END_FUNCTION, END)
        if found == "":
            return False
        if found == PARAMETER:
            self.mode = "key"
        elif found == END:
            self._close_xml_call()
            self.mode = TEXT
        elif found == END_FUNCTION:
            self._close_xml_call()
            self.mode = TEXT
            self._pending_end = END
        else:
            self._garbage()
        return True
