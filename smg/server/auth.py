"""Gateway authentication on the routes: serving routes take the shared key or a tenant key,
admin routes the shared key only (the keys and tenants themselves: `smg.admission.tenants`).

`x-api-key` is never read: it belongs to the Anthropic API and is passed upstream on that
backend only. A client that sends only `x-api-key` is told where the gateway key goes.
"""

from __future__ import annotations

from collections.abc import Mapping

from smg.admission.tenants import Caller
from smg.server.state import Gateway


def caller(gateway: Gateway, headers: Mapping[str, str], client_ip: str | None) -> Caller:
    """The caller of a serving route. Raises the 401 `ApiError`."""
    return gateway.admission.keys.caller(headers, client_ip)


def check_admin(gateway: Gateway, headers: Mapping[str, str]) -> None:
    """Raises the 401 unless the request carries the shared key (or no key is configured)."""
    gateway.admission.keys.admin(headers)


def tenant_of(gateway: Gateway, headers: Mapping[str, str], client_ip: str | None) -> str:
    """Who is asking, for the journal (an unauthenticated caller: its address)."""
    return gateway.admission.keys.tenant(headers, client_ip)
