"""Non-streaming response bodies: `Message`, its output content blocks and `Usage`, plus the
count_tokens answer.

`parse_message_response` is strict where the gateway promises a schema (an unknown block type,
an unknown `stop_reason` or a missing required field is a `ValueError`, which the Anthropic
backend turns into 502 `parse_error`); `message_to_dict` re-serializes: unmodeled fields are
dropped, unset optional fields omitted, `stop_reason` and `stop_sequence` always present.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_serializer,
)

from smg.protocol import codec
from smg.protocol.content import TypedModel
from smg.protocol.errors import ApiError

StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]

TokenCount = Annotated[StrictInt, Field(ge=0)]


class _Out(TypedModel):
    """An output model: unknown keys dropped, `None` fields omitted unless listed in
    `_keep_null` (keys the public API always sends, null or not)."""

    model_config = ConfigDict(extra="ignore")
    _keep_null: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_nulls(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k in self._keep_null}


class TextContent(_Out):
    type: Literal["text"] = "text"
    text: StrictStr
    citations: list[dict[str, Any]] | None = None


class ToolUseContent(_Out):
    type: Literal["tool_use"] = "tool_use"
    id: StrictStr
    name: StrictStr
    input: Any
    caller: dict[str, Any] | None = None


class ThinkingContent(_Out):
    type: Literal["thinking"] = "thinking"
    thinking: StrictStr
    signature: StrictStr


class RedactedThinkingContent(_Out):
    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: StrictStr


class ServerToolUseContent(_Out):
    type: Literal["server_tool_use"] = "server_tool_use"
    id: StrictStr
    name: StrictStr
    input: Any


class WebSearchToolResultContent(_Out):
    type: Literal["web_search_tool_result"] = "web_search_tool_result"
    tool_use_id: StrictStr
    content: Any


class ToolSearchToolResultContent(_Out):
    type: Literal["tool_search_tool_result"] = "tool_search_tool_result"
    tool_use_id: StrictStr
    content: Any


class ToolReferenceContent(_Out):
    type: Literal["tool_reference"] = "tool_reference"
    tool_name: StrictStr
    description: StrictStr | None = None


class McpToolUseContent(_Out):
    type: Literal["mcp_tool_use"] = "mcp_tool_use"
    id: StrictStr
    name: StrictStr
    server_name: StrictStr
    input: Any


class McpToolResultContent(_Out):
    _keep_null: ClassVar[frozenset[str]] = frozenset({"content", "is_error"})

    type: Literal["mcp_tool_result"] = "mcp_tool_result"
    tool_use_id: StrictStr
    content: StrictStr | list[Any] | None = None
    is_error: StrictBool | None = None


ContentBlock = Annotated[
    TextContent
    | ToolUseContent
    | ThinkingContent
    | RedactedThinkingContent
    | ServerToolUseContent
    | WebSearchToolResultContent
    | ToolSearchToolResultContent
    | ToolReferenceContent
    | McpToolUseContent
    | McpToolResultContent,
    Field(discriminator="type"),
]


class Usage(_Out):
    input_tokens: TokenCount
    output_tokens: TokenCount
    cache_creation_input_tokens: TokenCount | None = None
    cache_read_input_tokens: TokenCount | None = None
    cache_creation: dict[str, Any] | None = None
    server_tool_use: dict[str, Any] | None = None
    service_tier: StrictStr | None = None


class Message(_Out):
    _keep_null: ClassVar[frozenset[str]] = frozenset({"stop_reason", "stop_sequence"})

    id: StrictStr
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock]
    model: StrictStr
    stop_reason: StopReason | None = None
    stop_sequence: StrictStr | None = None
    usage: Usage


class CountTokensResponse(BaseModel):
    """`POST /v1/messages/count_tokens` answer."""

    input_tokens: TokenCount


_REQUIRED_ENVELOPE = ("id", "type", "role", "content", "model", "usage")


def parse_message_response(data: object) -> Message:
    """Parse an upstream non-streaming body; any departure from the schema is a `ValueError`."""
    if not isinstance(data, dict):
        raise ValueError("message body is not a JSON object")
    missing = [key for key in _REQUIRED_ENVELOPE if key not in data]
    if missing:
        raise ValueError(f"message body lacks {', '.join(missing)}")
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        location = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{location}: {first['msg']}") from None


def message_to_dict(message: Message) -> dict[str, Any]:
    """The JSON-ready body of a `Message`, in the public API's key order."""
    return message.model_dump(mode="json")


def reserialized_message(raw: bytes) -> dict[str, Any]:
    """An upstream's Message body parsed into the model and written back as a dict (unmodeled
    fields dropped, null optionals omitted). Raises 502 `parse_error` when it does not parse."""
    try:
        return message_to_dict(parse_message_response(codec.loads(raw)))
    except (codec.BodyDecodeError, ValueError):
        raise ApiError(502, "Invalid response from backend", code="parse_error") from None
