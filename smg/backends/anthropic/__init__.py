"""The Anthropic API backend: requests forwarded to `<worker URL>/v1/messages` with the client's
own credentials, and the gateway-run MCP tool loop when a request asks for it."""

from smg.backends.anthropic.backend import AnthropicConnector

__all__ = ["AnthropicConnector"]
