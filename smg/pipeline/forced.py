"""The output stage of `tool_choice: {"type":"tool","name":X}` under a `json_schema` constraint.

The engine was made to write exactly the arguments object of tool X, so the whole output is
that tool's input. Streaming: a `tool_use` block named X opens at the first output and every
chunk is passed on verbatim as its input JSON. Non-streaming: the output is kept until the end
and becomes the call if it parses as a JSON object, else it stays text (spec §F.3).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from smg.pipeline.generation import Piece, Text, ToolArgs, ToolCall


class ForcedToolStage:
    def __init__(self, name: str, stream: bool, tool_id: str = "") -> None:
        self.name = name
        self.stream = stream
        self.tool_id = tool_id  # "" lets the generation assign its stable id
        self._opened = False
        self._held: list[str] = []

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for piece in pieces:
            if not isinstance(piece, Text):
                out.append(piece)
            elif not self.stream:
                self._held.append(piece.text)
            elif piece.text:
                if not self._opened:
                    self._opened = True
                    out.append(ToolCall(self.tool_id, self.name))
                out.append(ToolArgs(piece.text))
        return out

    def flush(self) -> list[Piece]:
        if self.stream:
            return []
        raw = "".join(self._held)
        self._held = []
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return [ToolCall(self.tool_id, self.name), ToolArgs(json.dumps(parsed, ensure_ascii=False))]
        return [Text(raw)] if raw else []
