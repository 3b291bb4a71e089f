"""Request bodies of `POST /v1/messages` and `POST /v1/messages/count_tokens`.

Field-level rules live here (types, ranges, required fields); rules spanning several fields
live in `smg.protocol.validation`. Unknown top-level keys are allowed and kept in
`model_extra` (`context_management`, `output_config`, …); an unknown key inside a message
object is refused. Integers are strict: no float, bool or string is coerced into one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
)
from pydantic_core import PydanticCustomError

from smg.protocol.content import (
    OBJECT_TAG,
    STR_TAG,
    InputContent,
    SystemContent,
    TypedModel,
    str_or_object,
)
from smg.protocol.tools import ToolList

U32_MAX = 2**32 - 1

U32 = Annotated[StrictInt, Field(ge=0, le=U32_MAX)]


def _non_empty_model(value: str) -> str:
    if not value:
        raise PydanticCustomError("string_below_min_length", "model field is required and cannot be empty")
    return value


def _non_empty_messages(value: list[Any]) -> list[Any]:
    if not value:
        raise PydanticCustomError("empty_array", "messages array is required and cannot be empty")
    return value


def _unit_range(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise PydanticCustomError("value_out_of_range", "range: 0..1")
    return value


def _stop_sequences_carry_text(value: list[str]) -> list[str]:
    if any(not s.strip() for s in value):
        raise PydanticCustomError("invalid_stop_sequence", "each stop sequence must contain non-whitespace")
    return value


ModelId = Annotated[StrictStr, AfterValidator(_non_empty_model)]
UnitFloat = Annotated[StrictFloat, AfterValidator(_unit_range)]


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant", "system"]
    content: InputContent


Messages = Annotated[list[InputMessage], AfterValidator(_non_empty_messages)]
StopSequences = Annotated[list[StrictStr], AfterValidator(_stop_sequences_carry_text)]


# --- tool_choice ---------------------------------------------------------------------------


class ToolChoiceAuto(TypedModel):
    type: Literal["auto"] = "auto"
    disable_parallel_tool_use: StrictBool | None = None


class ToolChoiceAny(TypedModel):
    type: Literal["any"] = "any"
    disable_parallel_tool_use: StrictBool | None = None


class ToolChoiceTool(TypedModel):
    type: Literal["tool"] = "tool"
    name: StrictStr
    disable_parallel_tool_use: StrictBool | None = None


class ToolChoiceNone(TypedModel):
    type: Literal["none"] = "none"


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
    Field(discriminator="type"),
]


# --- thinking ------------------------------------------------------------------------------


class ThinkingEnabled(TypedModel):
    type: Literal["enabled"] = "enabled"
    budget_tokens: Annotated[StrictInt, Field(ge=1024, le=U32_MAX)]
    # Any string: the public API keeps adding display modes (summarized, omitted, …).
    display: StrictStr | None = None


class ThinkingAdaptive(TypedModel):
    type: Literal["adaptive"] = "adaptive"
    display: StrictStr | None = None


class ThinkingDisabled(TypedModel):
    type: Literal["disabled"] = "disabled"


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")]


# --- other request objects -----------------------------------------------------------------


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    user_id: StrictStr | None = None


class ContainerParams(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: StrictStr | None = None


Container = Annotated[
    Annotated[StrictStr, Tag(STR_TAG)] | Annotated[ContainerParams, Tag(OBJECT_TAG)],
    str_or_object(),
]


class McpToolConfiguration(BaseModel):
    model_config = ConfigDict(extra="allow")

    enabled: StrictBool | None = None
    allowed_tools: list[StrictStr] | None = None


class McpServer(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: StrictStr = "url"
    name: StrictStr
    url: StrictStr
    authorization_token: StrictStr | None = None
    tool_configuration: McpToolConfiguration | None = None


# --- the two request bodies ----------------------------------------------------------------


class CreateMessageRequest(BaseModel):
    """`POST /v1/messages`."""

    model_config = ConfigDict(extra="allow")

    model: ModelId
    messages: Messages
    max_tokens: U32
    system: SystemContent | None = None
    stream: StrictBool | None = None
    temperature: UnitFloat | None = None
    top_p: UnitFloat | None = None
    top_k: U32 | None = None
    stop_sequences: StopSequences | None = None
    tools: ToolList | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    container: Container | None = None
    mcp_servers: list[McpServer] | None = None
    rid: StrictStr | None = None

    @property
    def is_stream(self) -> bool:
        return bool(self.stream)


class CountTokensRequest(BaseModel):
    """`POST /v1/messages/count_tokens`: no `max_tokens`; any other key is kept."""

    model_config = ConfigDict(extra="allow")

    model: ModelId
    messages: Messages
    system: SystemContent | None = None
    tools: ToolList | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


# The modeled optional fields of a Messages request: an explicit `null` on one of them means
# the same as leaving it out, and a re-serialized body omits it.
OPTIONAL_FIELDS: frozenset[str] = frozenset(
    name for name, info in CreateMessageRequest.model_fields.items() if not info.is_required()
)
