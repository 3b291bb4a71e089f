"""Reasoning parsers: which one a model gets, whether its output starts inside reasoning, and
building the text stage (behaviors.md §F.6–§F.8).

The caller runs a reasoning stage only when thinking is enabled or adaptive, first among the
text stages: `make_reasoning_parser(name, starts_in_reasoning(name, prompt.thinking, prompt.text))`,
plus `start_consumed=start_in_prompt(name, prompt.text)` to treat a later start marker as the
reference does when the template prefilled it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from smg.pipeline.generation import TextStage
from smg.pipeline.parsers.reasoning.base import MarkerParser
from smg.pipeline.parsers.reasoning.models import PARSER_CLASSES, PassthroughParser

__all__ = [
    "DETECTION_PATTERNS",
    "REASONING_PARSERS",
    "MarkerParser",
    "detect_reasoning_parser",
    "make_reasoning_parser",
    "needs_special_tokens",
    "start_in_prompt",
    "starts_in_reasoning",
]

_ALL: tuple[type[MarkerParser], ...] = (MarkerParser, *PARSER_CLASSES)
REASONING_PARSERS: Mapping[str, type[MarkerParser]] = MappingProxyType({cls.name: cls for cls in _ALL})

# behaviors.md §F.7, in order: a case-insensitive substring of the model id, first match wins.
DETECTION_PATTERNS: tuple[tuple[str, str], ...] = (
    ("deepseek-r1", "deepseek_r1"),
    ("deepseek-v4", "deepseek_v4"),
    ("deepseek_v4", "deepseek_v4"),
    ("deepseek-v3.1", "deepseek_v31"),
    ("deepseek-v3-1", "deepseek_v31"),
    ("qwen3-thinking", "qwen3_thinking"),
    ("qwen-thinking", "qwen3_thinking"),
    ("qwen3", "qwen3"),
    ("qwen", "qwen3"),
    ("glm45", "glm45"),
    ("glm47", "glm45"),
    ("glm-5", "glm45"),
    ("kimi-k2-thinking", "kimi_thinking"),
    ("kimi-k2.5", "kimi_k25"),
    ("kimi-k3", "kimi_k3"),
    ("kimi_k3", "kimi_k3"),
    ("kimi", "kimi"),
    ("step3", "step3"),
    ("minimax", "minimax"),
    ("minimax-m2", "minimax"),
    ("mm-m2", "minimax"),
    ("command-r", "cohere_cmd"),
    ("command-a", "cohere_cmd"),
    ("c4ai-command", "cohere_cmd"),
    ("cohere", "cohere_cmd"),
    ("nemotron-nano", "nano_v3"),
    ("nemotron-super", "nano_v3"),
    ("nano-v3", "nano_v3"),
    ("nemotron-3", "nano_v3"),
    ("inkling", "inkling"),
)


def detect_reasoning_parser(model_id: str) -> str | None:
    """The reasoning parser for a model id by §F.7's first matching pattern; None when nothing
    matches (as the reference's `has_parser_for_model`: the first match decides)."""
    model = model_id.lower()
    for pattern, name in DETECTION_PATTERNS:
        if pattern in model:
            return name if name in REASONING_PARSERS else None
    return None


def _parser_class(name: str) -> type[MarkerParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}") from None


def needs_special_tokens(name: str) -> bool:
    """Whether the parser's markers are special tokens the detokenizer must keep (unknown
    names: no)."""
    cls = REASONING_PARSERS.get(name)
    return cls is not None and cls.special_tokens


def start_in_prompt(name: str, prompt_text: str) -> bool:
    """Whether the rendered prompt ends with the parser's start marker (possibly followed by
    whitespace): the template or a prefill already opened reasoning and consumed the marker."""
    cls = _parser_class(name)
    return cls is not PassthroughParser and prompt_text.rstrip().endswith(cls.start)


def starts_in_reasoning(name: str, prompt_thinking: bool | None, prompt_text: str) -> bool:
    """Whether the output of this render starts inside reasoning.

    The prompt's own markers decide first: ending with the end marker (the template closed
    thinking, e.g. Qwen3's `<think>\\n\\n</think>\\n\\n`) → False; ending with the start marker
    (the template prefilled `<think>`) → True. Otherwise thinking turned off for the render
    (`prompt_thinking is False`) → False, else the parser's own default (§F.8 "starts in
    reasoning"). `passthrough` never is.
    """
    cls = _parser_class(name)
    if cls is PassthroughParser:
        return False
    tail = prompt_text.rstrip()
    if tail.endswith(cls.end):
        return False
    if tail.endswith(cls.start):
        return True
    if prompt_thinking is False:
        return False
    return cls.default_in_reasoning


def make_reasoning_parser(name: str, in_reasoning: bool, *, start_consumed: bool = False) -> TextStage:
    """A fresh parser (one per generation). `start_consumed`: the prompt already held the start
    marker, so a start marker in the output is literal text (the reference's
    `mark_think_start_stripped`)."""
    return _parser_class(name)(in_reasoning, start_consumed=start_consumed)
