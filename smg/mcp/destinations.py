"""Which `mcp_servers[].url` the gateway may dial: the fetch policy (`smg.fetch`), plus the
servers the operator listed in the MCP config.

A client names the MCP servers the gateway connects to, so an MCP server URL is a URL fetched
on the client's behalf like an image URL: one on loopback or the internal network is refused
(400 `mcp_server_url_refused`, before any server is dialled) unless `--fetch-allow` opens its
range or the MCP config's `servers:` names that exact URL (the operator vouches for it). Each
connection is vetted again when it is dialled (`smg.fetch.dial`), so a name that resolves
elsewhere the second time is still refused. A URL that is not http(s) or whose name does not
resolve is left to the connection, which fails and is skipped like any server that does not
connect.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from smg.fetch import DestinationPolicy, FetchError, vet_url
from smg.fetch.dial import Unresolved
from smg.mcp.client import ServerSpec
from smg.mcp.config import McpConfig
from smg.protocol.errors import ApiError

HINT = "allow it with --fetch-allow, or list the server under `servers:` in the MCP config"
# A server the operator listed is dialled wherever it is.
OPEN = DestinationPolicy((ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")))


def url_refused(message: str) -> ApiError:
    return ApiError(400, message, code="mcp_server_url_refused")


async def server_policies(
    specs: Sequence[ServerSpec], config: McpConfig, policy: DestinationPolicy
) -> dict[str, DestinationPolicy]:
    """The policy each server's connection is dialled under, by server name. Raises the
    request's 400 for the first URL the policy refuses."""
    policy = policy.with_hint(HINT)
    out: dict[str, DestinationPolicy] = {}
    for spec in specs:
        if spec.name in out:
            continue  # a name given twice: the first entry wins (as `McpConnections.connect`)
        if config.knows_url(spec.url):
            out[spec.name] = OPEN
            continue
        out[spec.name] = policy
        parts = urlsplit(spec.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            continue  # reported by the connection as not connecting
        try:
            await vet_url(policy, spec.url)
        except Unresolved:
            continue
        except FetchError as exc:
            raise url_refused(exc.describe(f"MCP server {spec.name!r}")) from None
    return out
