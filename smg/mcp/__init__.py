"""The MCP tool loop: with `X-SMG-MCP: enabled` and an `mcp_toolset`, the gateway connects to the
request's MCP servers (official `mcp` SDK, Streamable HTTP), exposes their tools to the model
and runs the calls it makes (behaviors.md §I). Used by the Anthropic API backend; it knows the
model only through `smg.mcp.model.ModelClient`."""

from smg.mcp.config import McpConfig, McpConfigError, load_mcp_config
from smg.mcp.loop import MAX_ROUNDS, LoopRequest, run_loop, wants_loop

__all__ = ["MAX_ROUNDS", "LoopRequest", "McpConfig", "McpConfigError", "load_mcp_config", "run_loop", "wants_loop"]
