"""The `passthrough` tool parser (behaviors.md §F.8): no tool calls; text passes unchanged. It is
what a model without a known format gets, and what an unimplemented parser name falls back to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from smg.pipeline.generation import Piece
from smg.pipeline.parsers.tools.base import IdFactory, Tools


class PassthroughParser:
    name: ClassVar[str] = "passthrough"

    def __init__(self, tools: Tools | None = None, *, new_id: IdFactory | None = None) -> None:
        self.tools: Tools = list(tools or [])
        self.calls = 0

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        return list(pieces)

    def flush(self) -> list[Piece]:
        return []
