"""Content blocks of the MCP tool loop: the `mcptoolu_` ids, the `mcp_tool_use` /
`mcp_tool_result` pair a call becomes, and what the model is sent back (behaviors.md I.3,
I.4)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MCP_ID_PREFIX = "mcptoolu_"

# Output block types that are the loop's own: never sent back to the model.
_MCP_BLOCKS = frozenset({"mcp_tool_use", "mcp_tool_result"})


def mcp_id(tool_use_id: str) -> str:
    """`toolu_abc` → `mcptoolu_abc`; another id keeps its whole text after the prefix."""
    return MCP_ID_PREFIX + tool_use_id.removeprefix("toolu_")


def mcp_tool_use(tool_use: dict[str, Any], server: str) -> dict[str, Any]:
    return {
        "type": "mcp_tool_use",
        "id": mcp_id(tool_use["id"]),
        "name": tool_use["name"],
        "server_name": server,
        "input": tool_use.get("input", {}),
    }


def mcp_tool_result(tool_use_id: str, text: str, is_error: bool) -> dict[str, Any]:
    """The non-streaming result block: `is_error` is null on success, true on failure."""
    return {
        "type": "mcp_tool_result",
        "tool_use_id": mcp_id(tool_use_id),
        "content": [{"type": "text", "text": text}],
        "is_error": True if is_error else None,
    }


def mcp_tool_result_start(tool_use_id: str, text: str, is_error: bool) -> dict[str, Any]:
    """The streaming result block (in `content_block_start`): `is_error` is a boolean."""
    return {
        "type": "mcp_tool_result",
        "tool_use_id": mcp_id(tool_use_id),
        "is_error": is_error,
        "content": [{"type": "text", "text": text}],
    }


def tool_result(tool_use_id: str, text: str, is_error: bool) -> dict[str, Any]:
    """The `tool_result` block the model gets back."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if is_error:
        block["is_error"] = True
    return block


def assistant_input(blocks: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's output blocks as input blocks of the next request's assistant turn."""
    out: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind in _MCP_BLOCKS:
            continue
        if kind == "text" and not block.get("text"):
            continue  # the API refuses empty text blocks
        if kind == "tool_use":
            out.append({"type": "tool_use", "id": block["id"], "name": block["name"], "input": block.get("input", {})})
        else:
            out.append(block)
    return out
