"""The Anthropic stream events of one generated message, in the order of behaviors.md §D.2.

One block is open at a time; a single index counter names it and moves on when it closes. A
delta of another kind than the open block closes it first, so thinking, text and tool calls
fed in that order come out as thinking → text → tool_use blocks. Empty deltas emit nothing.

Non-streaming answers (`stream=False`) are folded into content afterwards, and there a
whitespace-only text residual must not become a block (§C.2): leading whitespace is held
until non-whitespace text arrives and is dropped if none does. Streams emit text as it comes
(§D.2), except where a tool call may follow (tool parsing on, or a call already made): there
whitespace is held the same way, so that a blank line before a tool call is no text block in
either answer, which stay two projections of the same events.
"""

from __future__ import annotations

from typing import Any, Literal

from smg.protocol import stream as ev

Event = dict[str, Any]
BlockKind = Literal["thinking", "text", "tool_use"]


class BlockBuilder:
    """Stream events for one message: `start`, then deltas, then `finish`."""

    def __init__(
        self,
        message_id: str,
        model: str,
        stream: bool = True,
        display_omitted: bool = False,
        tool_parsing: bool = False,
    ) -> None:
        self.display_omitted = display_omitted  # `thinking.display: omitted`: the block, not its text
        self.tool_parsing = tool_parsing  # the output may hold tool calls
        self.message_id = message_id
        self.model = model
        self.stream = stream
        self.index = 0
        self.open: BlockKind | None = None
        self.tool_calls = 0
        self._held_space = ""
        self.finished = False

    @property
    def has_tool_calls(self) -> bool:
        return self.tool_calls > 0

    def start(self, input_tokens: int = 0) -> list[Event]:
        """`message_start`: the empty message with zero usage (bar `input_tokens` when given)."""
        return [ev.message_start(self.message_id, self.model, {"input_tokens": input_tokens})]

    def thinking(self, delta: str) -> list[Event]:
        if not delta:
            return []
        events = self._open("thinking")
        if not self.display_omitted:
            events.append(ev.thinking_delta(self.index, delta))
        return events

    def text(self, delta: str) -> list[Event]:
        if not delta:
            return []
        if self.open != "text" and (not self.stream or self.tool_parsing or self.has_tool_calls):
            if not delta.strip():
                self._held_space += delta
                return []
            delta, self._held_space = self._held_space + delta, ""
        events = self._open("text")
        events.append(ev.text_delta(self.index, delta))
        return events

    def tool_call(self, id: str, name: str) -> list[Event]:
        """Open a `tool_use` block (`input: {}`, direct caller); its arguments follow as
        `tool_args` fragments."""
        events = self._close()
        self._held_space = ""
        self.open = "tool_use"
        self.tool_calls += 1
        events.append(ev.content_block_start(self.index, ev.tool_use_block(id, name)))
        return events

    def tool_args(self, fragment: str) -> list[Event]:
        if not fragment:
            return []
        if self.open != "tool_use":
            raise RuntimeError("tool call arguments with no tool_use block open")
        return [ev.input_json_delta(self.index, fragment)]

    def finish(
        self,
        stop_reason: str,
        stop_sequence: str | None,
        output_tokens: int,
        input_tokens: int | None,
    ) -> list[Event]:
        """Close the open block, then `message_delta` and `message_stop`."""
        events = self._close()
        self._held_space = ""
        self.finished = True
        usage = {"output_tokens": output_tokens, "input_tokens": input_tokens}
        events.append(ev.message_delta(stop_reason, stop_sequence, usage))
        events.append(ev.message_stop())
        return events

    def _open(self, kind: BlockKind) -> list[Event]:
        if self.open == kind:
            return []
        events = self._close()
        self.open = kind
        block = ev.thinking_block() if kind == "thinking" else ev.text_block()
        events.append(ev.content_block_start(self.index, block))
        return events

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        events = [ev.content_block_stop(self.index)]
        self.open = None
        self.index += 1
        return events
