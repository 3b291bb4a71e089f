"""The reasoning parser of each model family: its markers and whether its output starts inside
reasoning (behaviors.md §F.8). They differ only in those facts; the parsing is `MarkerParser`'s.

`deepseek_v4` is here as well because it is the plain `<think>` format: the reference arms it
when the prompt prefills `<think>`, which `starts_in_reasoning` reads from the prompt. `kimi_k3`
is Kimi-K3's XTML `think` channel, with the channel rules of its own class. `inkling`'s typed
blocks have a module of their own.
"""

from __future__ import annotations

from collections.abc import Sequence

from smg.pipeline.generation import Piece
from smg.pipeline.parsers.reasoning.base import MarkerParser
from smg.pipeline.parsers.reasoning.inkling import InklingParser
from smg.pipeline.parsers.tools import kimik3 as xtml


class DeepSeekR1Parser(MarkerParser):
    name = "deepseek_r1"
    default_in_reasoning = True


class Qwen3Parser(MarkerParser):
    name = "qwen3"


class Qwen3ThinkingParser(MarkerParser):
    name = "qwen3_thinking"
    default_in_reasoning = True


class Glm45Parser(MarkerParser):
    name = "glm45"


class KimiParser(MarkerParser):
    name = "kimi"
    start = "◁think▷"
    end = "◁/think▷"


class KimiK25Parser(MarkerParser):
    name = "kimi_k25"


class KimiThinkingParser(MarkerParser):
    name = "kimi_thinking"
    default_in_reasoning = True


class Step3Parser(MarkerParser):
    name = "step3"
    default_in_reasoning = True


class MiniMaxParser(MarkerParser):
    name = "minimax"
    default_in_reasoning = True


class DeepSeekV31Parser(MarkerParser):
    name = "deepseek_v31"


class DeepSeekV4Parser(MarkerParser):
    name = "deepseek_v4"


class NanoV3Parser(MarkerParser):
    name = "nano_v3"


class CohereCmdParser(MarkerParser):
    name = "cohere_cmd"
    start = "<|START_THINKING|>"
    end = "<|END_THINKING|>"


class KimiK3Parser(MarkerParser):
    """Kimi-K3's `think` channel: `<|open|>think<|sep|>` … `<|close|>think<|sep|>` (the
    generation prompt opens it in thinking mode). The channel also ends where a sibling channel
    opens without closing it first: the `tools` channel's opening is passed on for the tool
    parser, the `response` wrapper dropped. Outside reasoning the `response` and `message`
    wrappers are not text either."""

    name = "kimi_k3"
    special_tokens = True
    start = f"{xtml.OPEN}think{xtml.SEP}"
    end = xtml.THINK_CLOSE
    siblings = (xtml.TOOLS_OPEN, xtml.RESPONSE_OPEN)
    wrappers = (xtml.RESPONSE_OPEN, xtml.RESPONSE_CLOSE, f"{xtml.OPEN}message{xtml.SEP}", xtml.MESSAGE_CLOSE)

    def _live_markers(self) -> list[str]:
        return super()._live_markers() + list(self.siblings if self.in_reasoning else self.wrappers)

    def _cross(self, marker: str) -> str:
        if marker == self.start or marker == self.end:
            return super()._cross(marker)
        if not self.in_reasoning:
            return ""  # a wrapper
        super()._cross(self.end)
        return marker if marker == xtml.TOOLS_OPEN else ""


class PassthroughParser(MarkerParser):
    """No reasoning extraction: every piece goes through unchanged, whatever the prompt said."""

    name = "passthrough"

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        return list(pieces)

    def flush(self) -> list[Piece]:
        return []


PARSER_CLASSES: tuple[type[MarkerParser], ...] = (
    DeepSeekR1Parser,
    Qwen3Parser,
    Qwen3ThinkingParser,
    Glm45Parser,
    KimiParser,
    KimiK25Parser,
    KimiThinkingParser,
    Step3Parser,
    MiniMaxParser,
    DeepSeekV31Parser,
    DeepSeekV4Parser,
    NanoV3Parser,
    CohereCmdParser,
    KimiK3Parser,
    InklingParser,
    PassthroughParser,
)
