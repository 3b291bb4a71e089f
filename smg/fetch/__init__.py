"""Outbound fetches on a client's behalf: where the gateway may connect, and how much it may take.

A request can name URLs the gateway then fetches itself (image URLs, MCP server URLs). This
package owns the destination policy (`policy`), the resolver and dialer that enforce it at the
socket (`dial`) and the bounded fetcher (`fetcher`). It sits beside `protocol`, below
`pipeline` and `mcp`: both use it, and it imports nothing of the gateway but `smg.flags`, so
neither has to import the other to share one policy.
"""

from smg.fetch.config import FetchConfig
from smg.fetch.dial import guarded_transport, vet_url
from smg.fetch.fetcher import Budget, Fetched, Fetcher
from smg.fetch.policy import DestinationPolicy, FetchError, Refused, parse_allow

__all__ = [
    "Budget",
    "DestinationPolicy",
    "FetchConfig",
    "FetchError",
    "Fetched",
    "Fetcher",
    "Refused",
    "guarded_transport",
    "parse_allow",
    "vet_url",
]
