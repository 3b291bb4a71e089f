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

from smg.pipeline.parsers.tools.base import TEXT, ToolParser

START_ACTION = "<|START_ACTION|>"
END_ACTION = "<|END_ACTION|>"
WRAPPERS = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")
NAME_KEYS = ("tool_name", "name")


class CohereParser(ToolParser):
    name = "cohere"
    start_markers = (START_ACTION, *WRAPPERS)

    def _open(self, marker: str) -> None:
        if marker == START_ACTION:
            self.mode = "action"
        else:  # a response wrapper: not text
            self._raw = []

    def _step_mode(self) -> bool:
        mode = self.mode
        if mode == "call" or mode == "item_call":
            outcome = self._step_json()
            if outcome is None:
                return False
            if outcome:
                self.mode = "next" if mode == "item_call" else "end"
            return True
        if not self._skip_ws():
            return False
        ch = self._buf[0]
        if mode == "action":
            if ch == "[":
                self._consume(1)
                self.mode = "item"
            elif ch == "{":
                self._start_json(NAME_KEYS)
                self.mode = "call"
            else:
                self._broken()
            return True
        if mode == "item":
            if ch != "{":
                self._broken()
                return True
            self._start_json(NAME_KEYS)
            self.mode = "item_call"
            return True
        if mode == "next":  # after an array element
            if ch == ",":
                self._consume(1)
                self.mode = "item"
            elif ch == "]":
                self._consume(1)
                self.mode = "end"
            else:
                self._broken()
            return True
        # "end": the action's closing marker
        found = self._expect(END_ACTION)
        if found == "":
            return False
        self._raw = []
        self.mode = TEXT
        if found is None:
            self._pending_end = END_ACTION
        return True

    def _broken(self) -> None:
        if self._committed:
            self._pending_end = END_ACTION
        self._fail()
