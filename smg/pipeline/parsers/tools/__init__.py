"""Tool-call parsers: text stages that turn a model's tool-call syntax into `ToolCall` /
`ToolArgs` pieces (behaviors.md §C.2, §D.2, §F.7, §F.8), the registry of them by name, the
auto-detection table, and the readers of JSON-schema-constrained output (§F.3).

`make_tool_parser(name, tools)` builds a fresh parser for one generation. Every name the
detection table can yield has one; an unknown name gets `passthrough`: the output stays text.
"""

from __future__ import annotations

from smg.pipeline.generation import TextStage
from smg.pipeline.parsers.tools.base import IdFactory, ToolParser, Tools, client_tool_use_id, random_tool_use_id
from smg.pipeline.parsers.tools.cohere import CohereParser
from smg.pipeline.parsers.tools.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from smg.pipeline.parsers.tools.deepseek_dsml import DeepSeekV4Parser, DeepSeekV32Parser
from smg.pipeline.parsers.tools.detect import MODEL_PATTERNS, detect_tool_parser
from smg.pipeline.parsers.tools.forced import parse_forced_any, parse_forced_tool
from smg.pipeline.parsers.tools.glm import Glm45Parser, Glm47Parser
from smg.pipeline.parsers.tools.inkling import InklingParser
from smg.pipeline.parsers.tools.jsonish import JsonParser, LlamaParser
from smg.pipeline.parsers.tools.kimik2 import KimiK2Parser
from smg.pipeline.parsers.tools.kimik3 import KimiK3Parser
from smg.pipeline.parsers.tools.minimax import MinimaxM2Parser
from smg.pipeline.parsers.tools.mistral import MistralParser
from smg.pipeline.parsers.tools.passthrough import PassthroughParser
from smg.pipeline.parsers.tools.pythonic import PythonicParser
from smg.pipeline.parsers.tools.qwen import QwenParser, QwenXmlParser
from smg.pipeline.parsers.tools.sarashina import SarashinaParser
from smg.pipeline.parsers.tools.step3 import Step3Parser

TOOL_PARSERS: dict[str, type[ToolParser] | type[PassthroughParser]] = {
    "json": JsonParser,
    "qwen": QwenParser,
    "qwen_xml": QwenXmlParser,
    "qwen_coder": QwenXmlParser,
    "nemotron": QwenXmlParser,
    "llama": LlamaParser,
    "pythonic": PythonicParser,
    "mistral": MistralParser,
    "deepseek": DeepSeekV3Parser,
    "deepseek31": DeepSeekV31Parser,
    "deepseek32": DeepSeekV32Parser,
    "deepseek_v4": DeepSeekV4Parser,
    "glm45_moe": Glm45Parser,
    "glm47_moe": Glm47Parser,
    "kimik2": KimiK2Parser,
    "kimi_k3": KimiK3Parser,
    "minimax_m2": MinimaxM2Parser,
    "sarashina": SarashinaParser,
    "step3": Step3Parser,
    "inkling": InklingParser,
    "cohere": CohereParser,
    "passthrough": PassthroughParser,
}


def has_tool_parser(name: str) -> bool:
    """Whether `name` is a parser that actually parses (not passthrough, not a fallback)."""
    return name in TOOL_PARSERS and name != "passthrough"


def make_tool_parser(name: str, tools: Tools | None = None, *, new_id: IdFactory | None = None) -> TextStage:
    """A fresh parser for one generation; `passthrough` for a name without a parser.
    `tools` are the request's OpenAI-style function tools; `new_id(i)` makes the id of the
    output's i-th call (default: random `toolu_` ids)."""
    cls = TOOL_PARSERS.get(name, PassthroughParser)
    return cls(tools, new_id=new_id)


__all__ = [
    "MODEL_PATTERNS",
    "TOOL_PARSERS",
    "IdFactory",
    "ToolParser",
    "client_tool_use_id",
    "detect_tool_parser",
    "has_tool_parser",
    "make_tool_parser",
    "parse_forced_any",
    "parse_forced_tool",
    "random_tool_use_id",
]
