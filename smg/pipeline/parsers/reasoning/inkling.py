"""Inkling's reasoning parser (behaviors.md §F.8 `inkling`): TML typed blocks rather than a
pair of think markers.

An Inkling turn is a sequence of typed messages, every control token a special token:

    <|message_model|><|content_thinking|>check sources<|end_message|>
    <|message_model|><|content_text|>Here it is.<|end_message|>
    <|message_model|>search<|content_invoke_tool_json|>{"name": "search", "args": {…}}<|end_message|>
    <|content_model_end_sampling|>

(written without the line breaks). A `<|content_thinking|>` block is reasoning, a
`<|content_text|>` block the answer, as is text outside any block. The header after
`<|message_model|>` (an author or tool name) and a text-mode invocation
(`<|content_invoke_tool_text|>` … up to its end), which no `tool_use` block can represent, are
dropped. A JSON invocation is passed on verbatim, its content type and end token included, for
the `inkling` tool parser. Every other control token is framing and not text. Unlike the
`<think>` formats, no whitespace is dropped after reasoning (TML puts none there) and every
`<|content_thinking|>` opens reasoning, so `start_consumed` means nothing here.
"""

from __future__ import annotations

from typing import ClassVar

from smg.pipeline.generation import Piece
from smg.pipeline.parsers.reasoning.base import MarkerParser
from smg.pipeline.parsers.tools import inkling as tml

CONTENT_INVOKE_TOOL_TEXT = "<|content_invoke_tool_text|>"

# The tokenizer's TML control tokens: none of them is ever text.
CONTROL_TOKENS = (
    "<|endoftext|>",
    "<|message_user|>",
    tml.MESSAGE_MODEL,
    "<|message_system|>",
    "<|message_tool|>",
    tml.CONTENT_TEXT,
    "<|content_image|>",
    tml.END_SAMPLING,
    tml.CONTENT_THINKING,
    "<|content_audio_input|>",
    "<|content_tool_error|>",
    "<|content_xml|>",
    tml.TOOL_JSON,
    CONTENT_INVOKE_TOOL_TEXT,
    tml.END_MESSAGE,
    "<|audio_end|>",
)
_ENDS = (tml.END_MESSAGE, tml.END_SAMPLING)

# The blocks: what the text between two control tokens is.
OUTSIDE, HEADER, REASONING, CONTENT, TOOL_JSON, TOOL_TEXT = range(6)
_SILENT = (HEADER, TOOL_TEXT)


class InklingParser(MarkerParser):
    name = "inkling"
    special_tokens = True
    # What the prompt checks of `starts_in_reasoning` read: a prompt that ends inside an open
    # thinking block starts the output in reasoning; one that ends a message does not.
    start = tml.CONTENT_THINKING
    end = tml.END_MESSAGE
    markers: ClassVar[list[str]] = list(CONTROL_TOKENS)

    def __init__(self, in_reasoning: bool, *, start_consumed: bool = False) -> None:
        self._block = REASONING if in_reasoning else OUTSIDE
        super().__init__(in_reasoning, start_consumed=start_consumed)

    def _live_markers(self) -> list[str]:
        return self.markers

    def _cross(self, marker: str) -> str:
        passed = ""
        block = self._block
        if marker == tml.MESSAGE_MODEL:
            block = HEADER
        elif marker == tml.TOOL_JSON:
            block, passed = TOOL_JSON, marker
        elif marker == CONTENT_INVOKE_TOOL_TEXT:
            block = TOOL_TEXT
        elif block == TOOL_JSON:
            passed = marker  # the tool parser reads the call's own framing
            if marker in _ENDS:
                block = OUTSIDE
        elif block == TOOL_TEXT:
            if marker in _ENDS:
                block = OUTSIDE
        elif marker == tml.CONTENT_THINKING:
            block = REASONING
        elif marker == tml.CONTENT_TEXT:
            block = CONTENT
        elif marker in _ENDS:
            block = OUTSIDE
        self._block = block
        self.in_reasoning = block == REASONING
        self._leads = self._lead_chars()
        return passed

    def _lead_chars(self) -> tuple[str, ...]:
        # In a dropped block every delta must take the scanning path, where `_emit` drops it:
        # the empty lead is in every text.
        return ("",) if self._block in _SILENT else ("<",)

    def _emit(self, text: str, out: list[Piece]) -> None:
        if self._block not in _SILENT:
            super()._emit(text, out)
