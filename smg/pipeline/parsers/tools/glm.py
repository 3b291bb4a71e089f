"""The GLM MoE tool-call formats (behaviors.md §F.8 `glm45_moe`, `glm47_moe`):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.5/4.6 put the name and each pair on their own lines; GLM-4.7/5 write the same without the
newlines. Both parsers read both layouts. Values are converted by the tool's schema
(values.py).
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.xmlish import XmlCallParser

START = "<tool_call>"
END = "</tool_call>"
KEY = "<arg_key>"
END_KEY = "</arg_key>"
VALUE = "<arg_value>"
END_VALUE = "</arg_value>"


class Glm45Parser(XmlCallParser):
    name = "glm45_moe"
    start_markers = (START,)
    value_ends = (END_VALUE, KEY, END)
    block_end = END
    _key_text = ""  # the `<arg_key>…</arg_key>` just read

    def _open(self, marker: str) -> None:
        self.mode = "function"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "value":
            return self._step_value()
        if mode == "function":
            if not self._skip_ws():
                return False
            name = self._read_name(lambda rest: rest[0].isspace() or rest.startswith("<"))
            if name is None:
                return False
            if not name:
                self._fail()
                return True
            self._open_xml_call(name)
            self.mode = "params"
            return True
        if mode == "key":
            read = self._read_until((END_KEY,), limit=256)
            if read is None:
                return False
            key, end = read
            if not end or not key.strip():
                self._garbage(KEY + key + end)
                return True
            self._key_text = KEY + key + end
            self._key = key.strip()
            self.mode = "value_tag"
            return True
        if not self._skip_ws():
            return False
        if mode == "value_tag":
            found = self._expect(VALUE)
            if found == "":
                return False
            if found is None:
                self._garbage(self._key_text)
            else:
                self._start_value(self._key)
            return True
        # "params": between pairs
        found = self._expect(KEY, END)
        if found == "":
            return False
        if found == KEY:
            self.mode = "key"
        elif found == END:
            self._close_xml_call()
            self.mode = TEXT
        else:
            self._garbage()
        return True


class Glm47Parser(Glm45Parser):
    name = "glm47_moe"
