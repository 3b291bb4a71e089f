"""The Inkling tool-call format (behaviors.md §F.8 `inkling`): TML typed messages,

    <|message_model|><|content_text|>I'll check.<|end_message|>
    <|message_model|>get_weather<|content_invoke_tool_json|>{"name": "get_weather", "args": {"city": "Paris"}}
    <|end_message|>

(written without the line breaks). A call is a `<|content_invoke_tool_json|>` block holding one
`{"name", "args"}` object (`arguments` is accepted for `args`); the arguments stream as they
arrive. The message framing is not content: `<|message_model|>` and the header after it (the
author or tool name) up to the content type, and the `<|content_text|>`, `<|content_thinking|>`,
`<|end_message|>` and `<|content_model_end_sampling|>` tokens are dropped wherever they are.
A call block that does not hold such an object — and a text-mode invocation
(`<|content_invoke_tool_text|>`), which has no arguments object — stays text.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools import jsonstream as js
from smg.pipeline.parsers.tools.base import TEXT, find_first
from smg.pipeline.parsers.tools.jsoncalls import JsonCallsParser

MESSAGE_MODEL = "<|message_model|>"
TOOL_JSON = "<|content_invoke_tool_json|>"
CONTENT_TEXT = "<|content_text|>"
CONTENT_THINKING = "<|content_thinking|>"
END_MESSAGE = "<|end_message|>"
END_SAMPLING = "<|content_model_end_sampling|>"

# Framing tokens that carry no content of their own.
_FRAMING = (CONTENT_TEXT, CONTENT_THINKING, END_MESSAGE, END_SAMPLING)
# What ends a message header: its content type (or, for an empty message, its end).
_HEADER_ENDS = (TOOL_JSON, CONTENT_TEXT, CONTENT_THINKING, END_MESSAGE, END_SAMPLING, MESSAGE_MODEL)
_HEADER_LIMIT = 256
_LONGEST_END = max(map(len, _HEADER_ENDS))


class InklingParser(JsonCallsParser):
    name = "inkling"
    start_markers = (MESSAGE_MODEL, TOOL_JSON, *_FRAMING)

    def _open(self, marker: str) -> None:
        if marker == MESSAGE_MODEL:
            self.mode = "header"
        elif marker == TOOL_JSON:
            self.mode = "open"
        else:
            self._raw = []  # framing: dropped
            self.mode = TEXT

    def _step_mode(self) -> bool:
        if self.mode != "header":
            return self._step_call_objects()
        # "header": the author or tool name up to the content type
        i, end = find_first(self._buf, _HEADER_ENDS)
        if i < 0 and len(self._buf) <= _HEADER_LIMIT + _LONGEST_END:
            return False
        if i < 0 or i > _HEADER_LIMIT:
            self._fail()  # no header is this long: not TML framing after all
            return True
        if end == TOOL_JSON:
            self._consume(i + len(end))
            self.mode = "open"
        elif end == MESSAGE_MODEL:
            self._consume(i)  # an empty message: the next header starts here
            self._raw = []
            self.mode = TEXT
        else:
            self._consume(i + len(end))
            self._raw = []  # a text or thinking message: its header is dropped
            self.mode = TEXT
        return True

    def _new_call_object(self) -> None:
        self._json = js.JsonCall(args_keys=("args", "arguments"))
