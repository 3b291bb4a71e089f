"""The Cohere Command tool-call format (behaviors.md §F.8 `cohere`), as the Command-A / R7B chat
templates write an assistant turn:

    <|START_RESPONSE|>Let me check.<|END_RESPONSE|>
    <|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}
    ]<|END_ACTION|>

The action holds a JSON array of calls (a single object is accepted too); `name` and
`arguments` are accepted for `tool_name` and `parameters`. The arguments object streams as it
arrives. The response wrappers (`<|START_RESPONSE|>` … and the newer templates'
`<|START_TEXT|>` …) are dropped from the text. `tool_call_id` is the call's position in the
turn, not the client's id: the tool_use ids are generated.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.base import TEXT
from smg.pipeline.parsers.tools.jsoncalls import JsonCallsParser

START_ACTION = "<|START_ACTION|>"
END_ACTION = "<|END_ACTION|>"
WRAPPERS = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")
NAME_KEYS = ("tool_name", "name")


class CohereParser(JsonCallsParser):
    name = "cohere"
    start_markers = (START_ACTION, *WRAPPERS)
    block_end = END_ACTION

    def _open(self, marker: str) -> None:
        if marker == START_ACTION:
            self.mode = "head"
        else:  # a response wrapper: not text
            self._raw = []

    def _step_mode(self) -> bool:
        if self.mode != "end":
            return self._step_call_objects()
        # "end": the action's closing marker
        if not self._skip_ws():
            return False
        found = self._expect(END_ACTION)
        if found == "":
            return False
        self._raw = []
        self.mode = TEXT
        if found is None:
            self._pending_end = END_ACTION
        return True

    def _new_call_object(self) -> None:
        self._start_json(NAME_KEYS)

    def _calls_done(self) -> None:
        self.mode = "end"
