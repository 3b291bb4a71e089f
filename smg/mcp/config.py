"""The MCP tool loop's settings, from `--mcp-config-path` (YAML or JSON; every key optional).

Approval is policy-only: the gateway never pauses a request to ask the client. Without a file,
or with an empty one, every tool of every server is allowed. The format::

    policy:
      default: allow            # allow | deny: the answer when no rule below names the tool
      servers:                  # keyed by `mcp_servers[].name` as the request names it
        search:
          default: deny         # this server's tools, unless named under `tools`
          tools:
            web_search: allow   # one tool
    connect_timeout_secs: 10    # per server: connect, initialize and list its tools
    call_timeout_secs: 300      # per tool call

The most specific rule wins: the tool's, then its server's `default`, then the global one.
A denied call is not sent to its server; the model gets an error result saying so. Unknown
keys and values other than `allow`/`deny` are refused when the file is loaded, so a typo
cannot silently allow what it meant to deny.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_DECISIONS = {"allow": True, "deny": False}


class McpConfigError(ValueError):
    """A configuration file that cannot be used, said plainly."""


@dataclass(frozen=True)
class ServerPolicy:
    default: bool | None = None
    tools: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class McpConfig:
    default_allow: bool = True
    servers: dict[str, ServerPolicy] = field(default_factory=dict)
    connect_timeout_secs: float = 10.0
    call_timeout_secs: float = 300.0

    def allows(self, server: str, tool: str) -> bool:
        """The policy's decision for one call."""
        rules = self.servers.get(server)
        if rules is not None:
            if tool in rules.tools:
                return rules.tools[tool]
            if rules.default is not None:
                return rules.default
        return self.default_allow


def load_mcp_config(path: Path | None) -> McpConfig:
    """Read and check a configuration file; `None` gives the defaults (allow everything)."""
    if path is None:
        return McpConfig()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise McpConfigError(f"cannot read MCP config {path}: {exc.strerror or exc}") from None
    return parse_mcp_config(text, source=str(path))


def parse_mcp_config(text: str, source: str = "MCP config") -> McpConfig:
    data = _load(text, source)
    if data is None:
        return McpConfig()
    _only(data, {"policy", "connect_timeout_secs", "call_timeout_secs"}, source)
    policy = data.get("policy") or {}
    _only(policy, {"default", "servers"}, f"{source}: policy")
    servers: dict[str, ServerPolicy] = {}
    raw_servers = policy.get("servers") or {}
    if not isinstance(raw_servers, dict):
        raise McpConfigError(f"{source}: policy.servers must be a mapping of server name to rules")
    for name, rules in raw_servers.items():
        where = f"{source}: policy.servers.{name}"
        rules = rules or {}
        _only(rules, {"default", "tools"}, where)
        tools = rules.get("tools") or {}
        if not isinstance(tools, dict):
            raise McpConfigError(f"{where}.tools must be a mapping of tool name to allow|deny")
        servers[str(name)] = ServerPolicy(
            default=_decision(rules["default"], f"{where}.default") if "default" in rules else None,
            tools={str(t): _decision(v, f"{where}.tools.{t}") for t, v in tools.items()},
        )
    return McpConfig(
        default_allow=_decision(policy.get("default", "allow"), f"{source}: policy.default"),
        servers=servers,
        connect_timeout_secs=_seconds(data, "connect_timeout_secs", 10.0, source),
        call_timeout_secs=_seconds(data, "call_timeout_secs", 300.0, source),
    )


def _load(text: str, source: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise McpConfigError(f"{source} is neither JSON nor YAML: {exc}") from None


def _only(value: Any, keys: set[str], where: str) -> None:
    if not isinstance(value, dict):
        raise McpConfigError(f"{where} must be a mapping")
    unknown = sorted(set(value) - keys)
    if unknown:
        known = ", ".join(sorted(keys))
        raise McpConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} (known: {known})")


def _decision(value: Any, where: str) -> bool:
    if isinstance(value, str) and value.lower() in _DECISIONS:
        return _DECISIONS[value.lower()]
    raise McpConfigError(f"{where} must be allow or deny, got {value!r}")


def _seconds(data: dict[str, Any], key: str, default: float, source: str) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise McpConfigError(f"{source}: {key} must be a positive number of seconds")
    return float(value)
