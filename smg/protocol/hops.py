"""The hop header: which smg gateways a request has already passed through, so that a loop of
gateways (a worker URL that leads back to the gateway, under another name or through a
proxy) is cut at the first return instead of multiplying requests.

Every request a gateway sends to a worker or an upstream (relayed requests, PD legs, discovery
and health probes, the Anthropic API) carries `x-smg-hops`: the ids of the gateways it passed
through, its own last. A gateway receiving a request whose chain holds its own id refuses it,
508 `loop_detected`, as does one receiving a chain already `MAX_HOPS` long; a chain of
different gateways is served, each appending its id. An id is random per gateway process
group (`instance_id`), so it names nothing about the host.

A client can send the header too: a gateway cannot tell a client from another gateway in
front of it, and the chain must pass along for a loop through two gateways to be seen. What
a client can do with it is refuse its own request, nothing more: only well-formed ids are
kept (anything else in the value is dropped, never relayed), and the gateway always appends
its own, which no client can remove. The header is not a credential and is journaled as sent;
it is never relayed back to a client.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

from smg.protocol.errors import ApiError

HOP_HEADER = "x-smg-hops"
# A chain this long is refused even without a loop: no sane deployment stacks more gateways.
MAX_HOPS = 8
_ID = re.compile(r"[0-9a-f]{16}")


def instance_id() -> str:
    """A new gateway id (64 random bits, hex)."""
    return secrets.token_hex(8)


def chain(value: str | None) -> list[str]:
    """The well-formed gateway ids of a hop header's value, in order."""
    if not value:
        return []
    return [part for part in (p.strip().lower() for p in value.split(",")) if _ID.fullmatch(part)]


def check_hops(headers: Mapping[str, str], own: str) -> None:
    """Raises 508 `loop_detected` when the request has been through this gateway already, or
    through too many gateways. `headers` are the request's, by lower-case name."""
    value = headers.get(HOP_HEADER)
    if value is None:
        return
    hops = chain(value)
    if own in hops:
        raise ApiError(
            508,
            "Loop detected: this request has already passed through this gateway (a worker URL leads back to it)",
            code="loop_detected",
        )
    if len(hops) >= MAX_HOPS:
        raise ApiError(
            508, f"Loop detected: this request has passed through {len(hops)} gateways", code="loop_detected"
        )


def outgoing_hops(headers: Mapping[str, str], own: str) -> str:
    """The hop header a request relayed on behalf of a client carries: the chain it came with,
    then this gateway."""
    return ", ".join([*chain(headers.get(HOP_HEADER)), own])
