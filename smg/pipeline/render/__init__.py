"""The prompt of a Messages request: the conversation rendered with the model's chat template and
tokenized, exactly the same for `/v1/messages` and `/v1/messages/count_tokens` (behaviors.md §E.3).

A final assistant message is a prefill the model continues: it is rendered open, with no fresh
generation prompt after it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from smg.observability import tracing
from smg.pipeline.render.bound import check_rendered
from smg.pipeline.render.convert import convert_messages, convert_tools
from smg.pipeline.tokenizers import ChatTemplateError, Tokenizer
from smg.protocol.errors import ApiError
from smg.protocol.request import (
    CountTokensRequest,
    CreateMessageRequest,
    ThinkingAdaptive,
    ThinkingDisabled,
    ThinkingEnabled,
)

__all__ = ["Prompt", "convert_messages", "convert_tools", "render_prompt"]


@dataclass
class Prompt:
    """A rendered prompt. `thinking` is whether thinking is effectively on for this render (None
    when the template has no toggle and the request did not say); `tools` are the function tools
    the template saw."""

    text: str
    ids: list[int]
    digest: str
    thinking: bool | None
    tools: list[dict[str, Any]] | None


def render_prompt(
    tokenizer: Tokenizer,
    request: CreateMessageRequest | CountTokensRequest,
    image_placeholder: str | None = None,
    *,
    within: int | None = None,
) -> Prompt:
    """Render and tokenize a request. A conversation the template refuses is a 400
    (`process_messages_failed`); a prompt that does not encode is a 500 (`tokenization_failed`);
    `within`: a prompt text that certainly has more tokens is a 400 (`context_length_exceeded`),
    refused before it is tokenized."""
    messages = convert_messages(request, tokenizer.content_format, image_placeholder)
    tools = convert_tools(request.tools, request.tool_choice)
    thinking = _requested_thinking(request)
    kwargs: dict[str, Any] = {}
    if thinking is not None and tokenizer.thinking_toggle is not None:
        kwargs[tokenizer.thinking_toggle] = thinking
    if thinking is None and tokenizer.thinking_toggle is not None:
        thinking = tokenizer.thinking_default
    prefill = bool(messages) and messages[-1]["role"] == "assistant"
    if prefill and messages[-1].get("content") is None:
        # A prefill of only thinking or tool calls: continue an empty answer.
        messages[-1] = {**messages[-1], "content": ""}
    try:
        with tracing.stage("render"):
            text = tokenizer.render(
                messages,
                tools,
                add_generation_prompt=not prefill,
                continue_final_message=prefill,
                **kwargs,
            )
    except ChatTemplateError as exc:
        raise ApiError(400, f"Failed to apply chat template: {exc}", code="process_messages_failed") from exc
    if within is not None:
        check_rendered(tokenizer, text, within)
    try:
        with tracing.stage("tokenize"):
            ids = tokenizer.encode(text)
    except Exception as exc:
        raise ApiError(500, f"Tokenization failed: {exc}", code="tokenization_failed") from exc
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Prompt(text=text, ids=ids, digest=digest, thinking=thinking, tools=tools)


def _requested_thinking(request: CreateMessageRequest | CountTokensRequest) -> bool | None:
    if isinstance(request.thinking, ThinkingEnabled | ThinkingAdaptive):
        return True
    if isinstance(request.thinking, ThinkingDisabled):
        return False
    return None
