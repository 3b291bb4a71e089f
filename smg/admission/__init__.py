"""Admission: what a request must pass between the server and the router.

One concern per module — `tenants` (the gateway keys and the tenant each request is charged
to), `concurrency` (slots and the wait queue; `fleet` the same counted across replicas in
Redis), `budgets` (tenant token budgets, with `policy` their config and `ledger`/`redis_ledger`
their storage) — composed around the router's handler by `Gates.wrap`,
outermost first: a request first waits for a slot, then (once rendered) for its budget.
Each gate journals its decision as an `admission` event; a refusal is a `Refused` error.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from journal.events import Event
from journal.prices import PriceTable
from smg.admission.budgets import Budgets, RateLimitConfig, budget_layer
from smg.admission.concurrency import ConcurrencyConfig, Limiter, Slots, concurrency_layer
from smg.admission.fleet import FleetLimiter
from smg.admission.refusal import Refused
from smg.admission.tenants import Keys, TenantConfig, parse_tenant_keys
from smg.backends.base import Call
from smg.shared.link import SharedStateConfig, is_redis_url, link

__all__ = [
    "Gates",
    "ConcurrencyConfig",
    "RateLimitConfig",
    "Refused",
    "TenantConfig",
    "build_admission",
]

Handler = Callable[[Call], AsyncGenerator[Event, None]]
COMPONENTS = (ConcurrencyConfig, TenantConfig, RateLimitConfig, SharedStateConfig)


class Gates:
    """The gates of one gateway: its keys, its concurrency limiter and its tenant budgets."""

    def __init__(self, keys: Keys, limiter: Slots | None = None, budgets: Budgets | None = None) -> None:
        self.keys = keys
        self.limiter = limiter
        self.budgets = budgets

    def wrap(self, handler: Handler, generates: Callable[[str], bool]) -> Handler:
        """`handler` inside the gates (concurrency outermost, then budgets). `generates`: which
        backends the gateway generates answers for (`Router.generates`), the ones budgets charge."""
        layers = []
        if self.limiter is not None:
            layers.append(concurrency_layer(self.limiter))
        if self.budgets is not None:
            layers.append(budget_layer(self.budgets, generates))
        for layer in reversed(layers):
            handler = layer(handler)
        return handler

    async def start(self) -> None:
        """Start what runs beside requests (a fleet limiter's heartbeat), in the serving loop."""
        if isinstance(self.limiter, FleetLimiter):
            await self.limiter.start()

    async def stop(self) -> None:
        if isinstance(self.limiter, FleetLimiter):
            await self.limiter.stop()

    def close(self) -> None:
        if self.budgets is not None:
            self.budgets.close()


def build_admission(
    api_key: str | None,
    tenants: TenantConfig | None = None,
    concurrency: ConcurrencyConfig | None = None,
    rate_limit: RateLimitConfig | None = None,
    shared: SharedStateConfig | None = None,
    tenant_secret: bytes | None = None,
    prices: PriceTable | None = None,
) -> Gates:
    """The gates from their settings (`tenant_secret`: see `tenants.load_tenant_secret`;
    `prices`: the price table budgets stated in money are spent at). Raises ValueError for
    settings that cannot work."""
    tenants = tenants or TenantConfig()
    concurrency = concurrency or ConcurrencyConfig()
    rate_limit = rate_limit or RateLimitConfig()
    shared = shared or SharedStateConfig()
    keys = Keys(api_key, parse_tenant_keys(tenants.api_keys, api_key), tenants, tenant_secret)
    concurrency.check()
    shared.check()
    policy = rate_limit.policy(trust_tenant_header=tenants.trust_header, prices=prices)
    budgets = Budgets(policy, rate_limit.ledger(shared), prices=prices) if policy is not None else None
    return Gates(keys, _limiter(concurrency, shared), budgets)


def _limiter(concurrency: ConcurrencyConfig, shared: SharedStateConfig) -> Slots | None:
    if concurrency.fleet is not None:
        if not is_redis_url(concurrency.fleet):
            raise ValueError(f"--fleet-concurrency takes a redis:// URL, got {concurrency.fleet!r}")
        if not concurrency.enabled:
            raise ValueError("--fleet-concurrency needs --max-concurrent-requests N (the fleet's limit)")
        meanwhile = "admit uncounted" if shared.fail_open else "refuse with 503"
        down = f"fleet-wide slots {meanwhile} until it returns"
        return FleetLimiter(concurrency, link(concurrency.fleet, down), shared)
    return Limiter(concurrency) if concurrency.enabled else None
