"""Tool definitions (`tools[]`): custom tools, `mcp_toolset` entries and server tools.

A custom tool carries only the public API's fields (anything else is refused); server tools
(`bash_*`, `web_search_*`, `tool_search_tool_*`, …) are kept whole, whatever their version, as
new ones appear all the time. A callable discriminator routes each entry, so error locations
read `tools.0.custom.name` as the public API words them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    StrictBool,
    StrictStr,
    StringConstraints,
    Tag,
)
from pydantic_core import PydanticCustomError

from smg.protocol.content import CacheControl, TypedModel

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"

ToolName = Annotated[str, StringConstraints(strict=True, max_length=128, pattern=TOOL_NAME_PATTERN)]


class InputSchema(BaseModel):
    """A custom tool's JSON Schema; only `type` is checked, other schema keys are kept."""

    model_config = ConfigDict(extra="allow")

    type: Literal["object"]
    properties: dict[str, Any] | None = None
    required: list[StrictStr] | None = None


class CustomTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["custom"] | None = None
    name: ToolName
    description: StrictStr | None = None
    input_schema: InputSchema
    defer_loading: StrictBool | None = None
    cache_control: CacheControl | None = None
    # Newer public-API fields the gateway does not interpret; kept and forwarded.
    strict: StrictBool | None = None
    input_examples: list[Any] | None = None
    eager_input_streaming: StrictBool | None = None
    allowed_callers: list[StrictStr] | None = None


class McpToolConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    enabled: StrictBool | None = None
    defer_loading: StrictBool | None = None


class McpToolset(TypedModel):
    type: Literal["mcp_toolset"] = "mcp_toolset"
    mcp_server_name: StrictStr
    default_config: McpToolConfig | None = None
    configs: dict[str, McpToolConfig] | None = None
    cache_control: CacheControl | None = None

    def enables(self, name: str) -> bool:
        """Whether the toolset exposes `name`: per-tool `enabled`, else the default, else true."""
        default = True
        if self.default_config is not None and self.default_config.enabled is not None:
            default = self.default_config.enabled
        config = (self.configs or {}).get(name)
        if config is not None and config.enabled is not None:
            return config.enabled
        return default


class ServerTool(BaseModel):
    """Any other tool `type` (bash, text editor, web search/fetch, code execution, …)."""

    model_config = ConfigDict(extra="allow")

    type: StrictStr
    name: StrictStr
    cache_control: CacheControl | None = None


def _tool_kind(value: Any) -> str | None:
    # Model instances come in when serializing.
    if isinstance(value, CustomTool):
        return "custom"
    if isinstance(value, McpToolset):
        return "mcp_toolset"
    if isinstance(value, ServerTool):
        return "server"
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind == "mcp_toolset":
        return "mcp_toolset"
    if kind is None or kind == "custom" or "input_schema" in value or not isinstance(kind, str):
        return "custom"
    return "server"


Tool = Annotated[
    Annotated[CustomTool, Tag("custom")]
    | Annotated[McpToolset, Tag("mcp_toolset")]
    | Annotated[ServerTool, Tag("server")],
    Discriminator(
        _tool_kind,
        custom_error_type="invalid_tool_definition",
        custom_error_message="Input should be a valid dictionary",
    ),
]


def _raw_tool_name(value: Any) -> str | None:
    if isinstance(value, dict) and value.get("type") != "mcp_toolset":
        name = value.get("name")
        if isinstance(name, str):
            return name
    return None


def _unique_names(value: Any) -> Any:
    # Runs on the raw list so a duplicate is reported before any per-tool error.
    if isinstance(value, list):
        seen: set[str] = set()
        for item in value:
            name = _raw_tool_name(item)
            if name is None:
                continue
            if name in seen:
                raise PydanticCustomError("duplicate_tool_names", "Tool names must be unique.")
            seen.add(name)
    return value


ToolList = Annotated[list[Tool], BeforeValidator(_unique_names)]


def tool_name(tool: CustomTool | McpToolset | ServerTool) -> str | None:
    """The name a tool declares (`mcp_toolset` entries have none)."""
    if isinstance(tool, McpToolset):
        return None
    return tool.name


def tool_matches(tool: CustomTool | McpToolset | ServerTool, name: str) -> bool:
    """Whether `tool_choice: {type: tool, name}` may name this tool."""
    if isinstance(tool, McpToolset):
        return tool.enables(name)
    return tool.name == name
