"""The destination policy's setting: `--fetch-allow CIDR…`, the ranges an operator opens."""

from __future__ import annotations

from dataclasses import dataclass, field

from smg.fetch.policy import DestinationPolicy, parse_allow
from smg.flags import option


@dataclass(frozen=True)
class FetchConfig:
    allow: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "--fetch-allow",
            "Address ranges (CIDR) the gateway may fetch from for a client (image URLs, MCP server URLs) "
            "although they are loopback, private, link-local…; several values, or repeat the flag.",
        ),
    )

    def policy(self) -> DestinationPolicy:
        """The policy these settings give. Raises `ValueError` for a value that is no CIDR."""
        return DestinationPolicy(parse_allow(self.allow))
