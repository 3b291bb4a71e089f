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
    servers:                    # servers the operator knows (optional)
      - name: search            # the `mcp_servers[].name` a request uses
        url: https://mcp.example.com/mcp
        token: ${MCP_SEARCH_TOKEN}   # bearer sent when the request brings none
    connect_timeout_secs: 10    # per server: connect, initialize and list its tools
    call_timeout_secs: 300      # per tool call

A configured server's URL may be dialled although `--fetch-allow` does not open its address
(by a request naming that exact URL: the operator vouches for it). A configured server's
token is used only for a request entry with the same name AND the same URL (so a client
cannot send it elsewhere), and only when the entry has no `authorization_token` of its own;
`${VAR}` is read from the environment when the file is loaded. Clients then need no MCP
secret at all.

The most specific rule wins: the tool's, then its server's `default`, then the global one.
A denied call is not sent to its server; the model gets an error result saying so. Unknown
keys and values other than `allow`/`deny` are refused when the file is loaded, so a typo
cannot silently allow what it meant to deny.
"""

from __future__ import annotations

import json
import os
import re
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
class KnownServer:
    """An MCP server the operator configured: its token, for requests that name it."""

    name: str
    url: str
    token: str | None = None

    def matches(self, name: str, url: str) -> bool:
        return name == self.name and url.rstrip("/") == self.url.rstrip("/")


@dataclass(frozen=True)
class McpConfig:
    default_allow: bool = True
    servers: dict[str, ServerPolicy] = field(default_factory=dict)
    known_servers: tuple[KnownServer, ...] = ()
    connect_timeout_secs: float = 10.0
    call_timeout_secs: float = 300.0

    def token_for(self, name: str, url: str) -> str | None:
        """The configured bearer token for a request's server entry, if the operator set one."""
        return next((k.token for k in self.known_servers if k.matches(name, url)), None)

    def knows_url(self, url: str) -> bool:
        """The operator listed a server at this URL (so it may be dialled wherever it is)."""
        return any(url.rstrip("/") == k.url.rstrip("/") for k in self.known_servers)

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
    _only(data, {"policy", "servers", "connect_timeout_secs", "call_timeout_secs"}, source)
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
        known_servers=_known_servers(data.get("servers") or [], source),
        connect_timeout_secs=_seconds(data, "connect_timeout_secs", 10.0, source),
        call_timeout_secs=_seconds(data, "call_timeout_secs", 300.0, source),
    )


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: str, where: str) -> str:
    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise McpConfigError(f"{where} names ${{{name}}}, which is not set in the environment")
        return os.environ[name]

    return _ENV_REFERENCE.sub(lookup, value)


def _known_servers(raw: Any, source: str) -> tuple[KnownServer, ...]:
    if not isinstance(raw, list):
        raise McpConfigError(f"{source}: servers must be a list of {{name, url, token}}")
    out: list[KnownServer] = []
    for i, entry in enumerate(raw):
        where = f"{source}: servers[{i}]"
        _only(entry, {"name", "url", "token"}, where)
        name, url, token = entry.get("name"), entry.get("url"), entry.get("token")
        if not isinstance(name, str) or not name:
            raise McpConfigError(f"{where}.name must be a non-empty string")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise McpConfigError(f"{where}.url must be an http:// or https:// URL")
        if token is not None and not isinstance(token, str):
            raise McpConfigError(f"{where}.token must be a string")
        out.append(KnownServer(name, url, _expand(token, f"{where}.token") if token else None))
    return tuple(out)


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
