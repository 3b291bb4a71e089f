"""Which MCP tools a request exposes to the model, and the request the model then receives
(behaviors.md I.2, I.3 step 2).

Per `mcp_toolset` (the first one for a server wins): with `configs`, only the tools listed
there, each if its `enabled` is true or unset and the default is; without, all tools when
`default_config.enabled` is true or unset. `defer_loading: true` (per tool, else the default)
is copied onto the tool. `mcp_servers` and the toolsets are removed, the exposed tools
appended as custom tools after the request's own, and `tool_choice` defaults to auto.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from smg.mcp.client import McpTool, ServerSpec
from smg.mcp.config import McpConfig
from smg.protocol.request import OPTIONAL_FIELDS, CreateMessageRequest
from smg.protocol.tools import McpToolset


def toolsets(request: CreateMessageRequest) -> list[McpToolset]:
    return [tool for tool in request.tools or () if isinstance(tool, McpToolset)]


def server_specs(request: CreateMessageRequest, config: McpConfig) -> list[ServerSpec]:
    """The servers to connect to; an entry without a token gets the operator's, if configured."""
    return [
        ServerSpec(s.name, s.url, s.authorization_token or config.token_for(s.name, s.url))
        for s in request.mcp_servers or ()
    ]


def exposed_tools(
    sets: Sequence[McpToolset], listed: Mapping[str, Iterable[McpTool]]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The tool definitions to send, and which server owns each tool name.

    `listed` holds the tools of the servers that connected; a toolset naming another server
    exposes nothing. A name two servers share goes to the first.
    """
    definitions: list[dict[str, Any]] = []
    owners: dict[str, str] = {}
    seen: set[str] = set()
    for toolset in sets:
        server = toolset.mcp_server_name
        if server in seen:
            continue
        seen.add(server)
        default = toolset.default_config
        default_enabled = default.enabled if default is not None and default.enabled is not None else True
        default_defer = bool(default.defer_loading) if default is not None else False
        for tool in listed.get(server, ()):
            if toolset.configs is not None:
                config = toolset.configs.get(tool.name)
                if config is None:
                    continue
                enabled = config.enabled if config.enabled is not None else default_enabled
                defer = config.defer_loading if config.defer_loading is not None else default_defer
            else:
                enabled, defer = default_enabled, default_defer
            if not enabled or tool.name in owners:
                continue
            owners[tool.name] = server
            definitions.append(_definition(tool, defer))
    return definitions, owners


def _definition(tool: McpTool, defer: bool) -> dict[str, Any]:
    schema = dict(tool.input_schema)
    schema.setdefault("type", "object")
    out: dict[str, Any] = {"name": tool.name}
    if tool.description:
        out["description"] = tool.description
    out["input_schema"] = schema
    if defer:
        out["defer_loading"] = True
    return out


def rewrite_request(body: Mapping[str, Any], model: str, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The client's body as the model receives it in the loop (unknown fields kept)."""
    out = {k: v for k, v in body.items() if k != "mcp_servers" and not (v is None and k in OPTIONAL_FIELDS)}
    out["model"] = model
    kept = [t for t in body.get("tools") or () if not (isinstance(t, dict) and t.get("type") == "mcp_toolset")]
    all_tools = kept + list(tools)
    if all_tools:
        out["tools"] = all_tools
        out.setdefault("tool_choice", {"type": "auto"})
    else:
        out.pop("tools", None)
    return out
