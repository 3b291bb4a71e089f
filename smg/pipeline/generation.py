"""One generation, sans I/O: engine output token ids in, Anthropic stream events out.

The live gRPC backend and offline replay both drive it the same way — `start()`, `feed(ids)`
per engine chunk, `finish(...)` once — and only move the events it returns. Per chunk:
EOS ids dropped → detokenizer → stop matcher → text stages → block builder.

The text stages are the seam for output parsers: a reasoning parser turns text into thinking
and text pieces, a tool-call parser turns text into text and tool-call pieces. With no stages,
all output is text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from smg.pipeline.blocks import BlockBuilder
from smg.pipeline.detokenize import Decoder, Detokenizer
from smg.pipeline.ids import from_parser_id, tool_use_id
from smg.pipeline.stops import StopMatcher
from smg.protocol import stream as ev

Event = dict[str, Any]


# --- what flows between stages -----------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Thinking:
    text: str


@dataclass(frozen=True)
class ToolCall:
    """A new tool call; its arguments follow as `ToolArgs` fragments."""

    id: str
    name: str


@dataclass(frozen=True)
class ToolArgs:
    fragment: str


Piece = Text | Thinking | ToolCall | ToolArgs


class TextStage(Protocol):
    """A parser between the stop matcher and the block builder. It sees every piece in order,
    rewrites the ones it understands (usually `Text`) and passes the others through."""

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]: ...

    def flush(self) -> list[Piece]:
        """Whatever it still holds at the end of the output."""
        ...


# --- the generation ----------------------------------------------------------------------------


@dataclass
class GenerationSettings:
    """What one generation needs to know. `stop_token_map` maps each single-token stop sequence
    the engine was given as a token id back to the user's string."""

    message_id: str
    model: str
    stream: bool
    stop_sequences: list[str] = field(default_factory=list)
    stop_token_map: dict[int, str] = field(default_factory=dict)
    eos_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    # How the output is parsed (decided by `smg.pipeline.output.plan_output`).
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    in_reasoning: bool = False
    start_consumed: bool = False
    forced_tool: str | None = None
    tools: list[dict[str, Any]] | None = None
    display_omitted: bool = False


class Generation:
    """Engine output → Anthropic events for one message (behaviors.md §C.2, §D.2, §D.3)."""

    def __init__(
        self,
        tokenizer: Decoder,
        settings: GenerationSettings,
        stages: Sequence[TextStage] = (),
    ) -> None:
        self.settings = settings
        self.stages: list[TextStage] = list(stages)
        self.blocks = BlockBuilder(
            settings.message_id,
            settings.model,
            stream=settings.stream,
            display_omitted=settings.display_omitted,
            tool_parsing=settings.tool_parser is not None or settings.forced_tool is not None,
        )
        self._detokenizer = Detokenizer(tokenizer, skip_special_tokens=settings.skip_special_tokens)
        self._stops = StopMatcher(settings.stop_sequences)
        self._eos = frozenset(settings.eos_token_ids)
        self.matched_stop: str | None = None

    @property
    def stopped(self) -> bool:
        """A stop sequence ended the output; later engine output is ignored."""
        return self.matched_stop is not None

    def start(self) -> list[Event]:
        return self.blocks.start()

    def feed(self, token_ids: Sequence[int]) -> list[Event]:
        """Events for one engine chunk of output ids; [] once a stop sequence has matched."""
        if self.stopped:
            return []
        ids: list[int] = []
        stop_token: str | None = None
        for token in token_ids:
            if token in self.settings.stop_token_map:
                stop_token = self.settings.stop_token_map[token]
                break
            if token not in self._eos:
                ids.append(token)
        text = self._stops.push(self._detokenizer.push(ids))
        if stop_token is not None and self._stops.matched is None:
            # The engine stopped on the stop's token: what the text matcher held was real text.
            text += self._stops.push(self._detokenizer.flush()) + self._stops.flush()
            if self._stops.matched is None:
                self.matched_stop = stop_token
        if self._stops.matched is not None:
            self.matched_stop = self._stops.matched
        return self._emit(self._through_stages([Text(text)] if text else []))

    def finish(
        self,
        finish_reason: str,
        prompt_tokens: int | None,
        completion_tokens: int,
        matched_token_id: int | None = None,
        matched_stop_str: str | None = None,
    ) -> list[Event]:
        """Flush everything held, close the blocks, and end the message with its stop reason
        and usage. Output ids that came with the engine's final message are fed first."""
        pieces: list[Piece] = []
        if not self.stopped:
            text = self._stops.push(self._detokenizer.flush())
            text += self._stops.flush()
            if self._stops.matched is not None:
                self.matched_stop = self._stops.matched
            pieces = [Text(text)] if text else []
        events = self._emit(self._through_stages(pieces, final=True))
        stop_reason, stop_sequence = self._stop_reason(finish_reason, matched_token_id, matched_stop_str)
        events += self.blocks.finish(stop_reason, stop_sequence, completion_tokens, prompt_tokens)
        return events

    def _stop_reason(
        self,
        finish_reason: str,
        matched_token_id: int | None,
        matched_stop_str: str | None,
    ) -> tuple[str, str | None]:
        if self.blocks.has_tool_calls or finish_reason == "tool_calls":
            return "tool_use", None
        if self.matched_stop is not None:
            return "stop_sequence", self.matched_stop
        # An engine match counts only as one of the request's stops; EOS ids do not.
        if matched_token_id is not None and matched_token_id in self.settings.stop_token_map:
            return "stop_sequence", self.settings.stop_token_map[matched_token_id]
        if matched_stop_str is not None and matched_stop_str in self.settings.stop_sequences:
            return "stop_sequence", matched_stop_str
        if finish_reason == "length":
            return "max_tokens", None
        return "end_turn", None

    def _through_stages(self, pieces: list[Piece], final: bool = False) -> list[Piece]:
        for stage in self.stages:
            pieces = stage.feed(pieces) if pieces else []
            if final:
                # What a stage held goes on through the stages after it.
                pieces += stage.flush()
        return pieces

    def _emit(self, pieces: Iterable[Piece]) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if isinstance(piece, Text):
                events += self.blocks.text(piece.text)
            elif isinstance(piece, Thinking):
                events += self.blocks.thinking(piece.text)
            elif isinstance(piece, ToolCall):
                # A call the model gave no id gets a stable one, so a recomputation matches.
                index = self.blocks.tool_calls
                tool_id = from_parser_id(piece.id) if piece.id else tool_use_id(self.settings.message_id, index)
                events += self.blocks.tool_call(tool_id, piece.name)
            else:
                events += self.blocks.tool_args(piece.fragment)
        return events


def empty_message(message_id: str, model: str, input_tokens: int) -> list[Event]:
    """The whole answer to `max_tokens: 0` (behaviors.md §C.5, §D.5): the empty message already
    carrying the prompt count, `stop_reason: max_tokens`, and the end."""
    return [
        ev.message_start(message_id, model, {"input_tokens": input_tokens}),
        ev.message_delta("max_tokens", None, {"output_tokens": 0, "input_tokens": input_tokens}),
        ev.message_stop(),
    ]
