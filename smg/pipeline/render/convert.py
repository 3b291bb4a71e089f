"""An Anthropic request turned into chat-template inputs: OpenAI-style messages and function tools
(behaviors.md §F.2).

Media is never fetched: an image becomes a placeholder part, a document becomes its text, and a
document with no text of its own cannot be rendered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson

from smg.protocol.content import (
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from smg.protocol.errors import ApiError
from smg.protocol.request import (
    CountTokensRequest,
    CreateMessageRequest,
    InputMessage,
    ToolChoice,
    ToolChoiceNone,
    ToolChoiceTool,
)
from smg.protocol.tools import CustomTool, InputSchema, Tool

ContentFormat = Literal["string", "openai"]
ChatMessage = dict[str, Any]
Part = dict[str, Any]

IMAGE_PART: Part = {"type": "image"}


def convert_messages(
    request: CreateMessageRequest | CountTokensRequest,
    content_format: ContentFormat = "string",
    image_placeholder: str | None = None,
    media_first: bool = True,
) -> list[ChatMessage]:
    """The conversation as chat-template messages: the top-level system prompt first, then each
    message in order. `image_placeholder` is what a "string" template gets for an image (images
    are dropped without one); `media_first` hoists images before text, keeping their order."""
    out: list[ChatMessage] = []
    if request.system is not None:
        out.append({"role": "system", "content": _system_text(request.system)})
    for index, message in enumerate(request.messages):
        if message.role == "system":
            out.append({"role": "system", "content": _system_text(message.content)})
        elif message.role == "user":
            out.extend(_user(message, index, content_format, image_placeholder, media_first))
        else:
            out.append(_assistant(message))
    return out


def convert_tools(tools: Sequence[Tool] | None, tool_choice: ToolChoice | None) -> list[dict[str, Any]] | None:
    """The custom tools as OpenAI function tools, as the template sees them: only the named tool
    for `tool_choice: tool`, none for `tool_choice: none`; None when nothing is left."""
    if not tools or isinstance(tool_choice, ToolChoiceNone):
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, CustomTool):
            continue
        if isinstance(tool_choice, ToolChoiceTool) and tool.name != tool_choice.name:
            continue
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = _schema(tool.input_schema)
        out.append({"type": "function", "function": function})
    return out or None


def _schema(schema: InputSchema) -> dict[str, Any]:
    """The schema as the client sent it (its values came from JSON already). Not `model_dump`:
    pydantic's serializer has a depth limit that a deeply nested, valid schema exceeds."""
    out = {name: getattr(schema, name) for name in type(schema).model_fields if name in schema.model_fields_set}
    out.update(schema.model_extra or {})
    return out


# --- per role ----------------------------------------------------------------------------------


def _system_text(content: str | Sequence[Any]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block.text for block in content if isinstance(block, TextBlock))


def _user(
    message: InputMessage,
    index: int,
    content_format: ContentFormat,
    image_placeholder: str | None,
    media_first: bool,
) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    # The blocks keep their order: a tool result is a `tool` message where it stands, the parts
    # around it user messages of their own, so a model sees its tool's answer right after its call
    # even when the client wrote text after the result (`[tool_result, text]`).
    out: list[ChatMessage] = []
    parts: list[Part] = []

    def flush() -> None:
        nonlocal parts
        if not parts:
            return
        if media_first:
            parts = [p for p in parts if p["type"] == "image"] + [p for p in parts if p["type"] != "image"]
        content: str | list[Part] = parts if content_format == "openai" else _join(parts, image_placeholder)
        out.append({"role": "user", "content": content})
        parts = []

    for position, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(dict(IMAGE_PART))
        elif isinstance(block, DocumentBlock):
            parts.append({"type": "text", "text": _document_text(block, f"messages.{index}.content.{position}")})
        elif isinstance(block, ToolResultBlock):
            flush()
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _tool_result_text(block)})
    flush()
    return out


def _assistant(message: InputMessage) -> ChatMessage:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": _arguments(block.input)},
                }
            )
    out: ChatMessage = {"role": "assistant", "content": "".join(texts) if texts else None}
    if thinking:
        out["reasoning_content"] = "\n".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


# --- blocks ------------------------------------------------------------------------------------


def _join(parts: Sequence[Part], image_placeholder: str | None) -> str:
    texts: list[str] = []
    for part in parts:
        if part["type"] == "text":
            texts.append(part["text"])
        elif image_placeholder is not None:
            texts.append(image_placeholder)
    return "\n".join(texts)


def _document_text(block: DocumentBlock, path: str) -> str:
    text = block.source_text()
    if text is None:
        raise ApiError(
            400,
            f"{path}: document source of type '{block.source.type}' has no text; "
            "only text and content document sources can be rendered for this model",
            code="process_messages_failed",
        )
    return text


def _tool_result_text(block: ToolResultBlock) -> str:
    if block.content is None:
        return ""
    if isinstance(block.content, str):
        return block.content
    return "\n".join(part.text for part in block.content if isinstance(part, TextBlock))


def _arguments(value: Any) -> Any:
    """The call's input as the JSON object templates expect, through a JSON round trip."""
    try:
        return orjson.loads(orjson.dumps(value))
    except (orjson.JSONEncodeError, orjson.JSONDecodeError) as exc:
        raise ApiError(
            400, f"Failed to parse tool call arguments as JSON: {exc}", code="process_messages_failed"
        ) from exc
