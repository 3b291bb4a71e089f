"""The formats whose calls are JSON call objects after a marker, alone or in an array (`json`,
`llama`, `qwen`, `mistral`, `cohere`, `sarashina`, `inkling`): reading them is one state machine,
with a format's choices as hooks.

Its modes: "open" (a call object is next), "head" (a call object or an array of them is next),
"item" (an array element is next), "element" (reading one), "next" (after one: `,` or `]`),
"call" (reading a lone call object). Whitespace between them is dropped.
"""

from __future__ import annotations

from smg.pipeline.parsers.tools.base import TEXT, ToolParser


class JsonCallsParser(ToolParser):
    def _step_call_objects(self) -> bool:
        """One step in one of the modes above."""
        mode = self.mode
        if mode == "call" or mode == "element":
            outcome = self._step_json()
            if outcome is None:
                return False
            if outcome:
                if mode == "element":
                    self.mode = "next"
                else:
                    self._calls_done()
            return True
        if not self._skip_ws():
            return False
        ch = self._buf[0]
        if mode == "next":
            if ch == ",":
                self._consume(1)
                self.mode = "item"
            elif ch == "]":
                self._consume(1)
                self._calls_done()
            else:
                self._broken()
        elif ch == "{":
            self._new_call_object()
            self.mode = "element" if mode == "item" else "call"
        elif mode == "head" and ch == "[":
            self._consume(1)
            self.mode = "item"
        elif mode == "head":
            self._head_other()
        else:
            self._broken()
        return True

    def _new_call_object(self) -> None:
        """Start reading a call object at the front of the buffer."""
        self._start_json()

    def _calls_done(self) -> None:
        """The lone object or the array ended: what comes after the calls."""
        self._raw = []
        self.mode = TEXT

    def _head_other(self) -> None:
        """What a head that is neither an object nor an array is (here: no call)."""
        self._broken()
