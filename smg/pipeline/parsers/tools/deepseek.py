"""The DeepSeek tool-call formats (behaviors.md §F.8 `deepseek`, `deepseek31`).

V3:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>   (no line break before <｜tool▁call▁end｜>)

Calls follow each other inside the block. The arguments object streams as it arrives. A call
that starts without the block's opening marker is accepted, as are missing closing markers.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.base import ToolParser
from smg.pipeline.parsers.tools.xmlish import NAME

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE = "```"
JSON_FENCE = "```json"


class DeepSeekV31Parser(ToolParser):
    name = "deepseek31"
    start_markers = (CALLS_BEGIN, CALL_BEGIN)
    block_end = CALLS_END
    _name = ""  # of the call being read

    def _open(self, marker: str) -> None:
        self.mode = "head" if marker == CALL_BEGIN else "block"

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "args":
            if not self._step_args():
                return False
            self.mode = "tail"
            return True
        if mode == "head":
            return self._step_head()
        if mode == "name":
            return self._step_name()
        if mode == "open_args":
            return self._step_open_args(self._name)
        if not self._skip_ws():
            return False
        if mode == "fence" or mode == "tail":
            # V3's code fence around the arguments.
            fence = JSON_FENCE if mode == "fence" else FENCE
            if fence.startswith(self._buf) and len(self._buf) < len(fence):
                return False
            if self._buf.startswith(fence):
                self._consume(len(fence))
            elif mode == "fence" and self._buf.startswith(FENCE):
                self._consume(len(FENCE))
            if mode == "tail":
                self._raw = []  # the closing fence is the finished call's
            self.mode = "open_args" if mode == "fence" else "block"
            return True
        # "block": between calls
        return self._step_between_calls(CALL_BEGIN, CALL_END, CALLS_END)

    def _step_head(self) -> bool:
        name = self._name_then(NAME, SEP)
        if name is None:
            return False
        if not name:
            self._broken()
            return True
        self._name = name
        self.mode = "open_args"
        return True

    def _step_name(self) -> bool:
        return False


class DeepSeekV3Parser(DeepSeekV31Parser):
    name = "deepseek"

    def _step_head(self) -> bool:
        kind = self._name_then(NAME, SEP)  # the call's type, "function"
        if kind is None:
            return False
        if not kind:
            self._broken()
            return True
        self.mode = "name"
        return True

    def _step_name(self) -> bool:
        match = NAME.match(self._buf)
        length = match.end() if match else 0
        if length == len(self._buf):
            return False
        if not length or not (self._buf[length].isspace() or self._buf[length] in "`{"):
            self._broken()
            return True
        self._name = self._consume(length)
        self.mode = "fence"
        return True
