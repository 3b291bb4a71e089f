"""Tenant token budgets (`--tenant-rate-limit-enabled --tenant-rate-limit-config FILE`): the
layer that reserves a request's prompt tokens before the engine is called and settles with the
real usage when the response ends.

As the reference gateway: only requests the gateway generates itself are charged (a connector
whose `generates` is true: gRPC, ZMQ, gRPC PD and EPD workers); count_tokens, `max_tokens: 0`
and relayed requests (HTTP workers, HTTP PD, the Anthropic API) pass untouched. The
reservation is the exact rendered prompt's token count (read from the connector's `rendered`
event, which comes before the engine call) and one request, taken from the tenant's scope and
its matching model rule; both must afford it, else 429
`tenant_rate_limit_exceeded` with `Retry-After` (left out when the request is larger than the
scope ever holds). A response that finishes (its `message_delta` came) is settled: the
budget is charged input + output − reserved more (possibly into debt). One that does not (an
engine error, a client gone) keeps only its reservation.

A model rule stated in money (`dollars_per_minute`, priced by `--price-table`) is charged in the
same reservation and settlement: the prompt's tokens at the model's input price before the
engine is called, then trued up to the request's cost by the table (input, output, cache reads
and writes of the final usage).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.events import Admission, Block, Event, Rendered, Routed, Settled
from journal.prices import Price, PriceTable
from smg.admission.ledger import Decision, Ledger, MemoryLedger, SqliteLedger
from smg.admission.policy import PolicySet, Scope, load_policy
from smg.admission.redis_ledger import RedisLedger
from smg.admission.refusal import Refused, shared_state_unavailable
from smg.backends.base import Call
from smg.flags import option
from smg.shared.link import SharedStateConfig, is_redis_url, link

Handler = Callable[[Call], AsyncGenerator[Event, None]]
IN_MEMORY = "memory"


@dataclass(frozen=True)
class RateLimitConfig:
    """`--tenant-rate-limit-enabled`, `--tenant-rate-limit-config`, `--tenant-rate-limit-state`."""

    enabled: bool = field(
        default=False,
        metadata=option("--tenant-rate-limit-enabled", "Charge each tenant's requests to its token budget."),
    )
    config: str | None = field(
        default=None,
        metadata=option("--tenant-rate-limit-config", "The budgets: a YAML file in the reference gateway's format."),
    )
    state: str = field(
        default="smg-rate-limit.db",
        metadata=option(
            "--tenant-rate-limit-state",
            "SQLite file holding the budgets, shared by every gateway naming it and kept across restarts; "
            "redis://HOST:PORT/DB shares them with every replica on any host; "
            "'memory' keeps them in this process only.",
        ),
    )

    def policy(self, *, trust_tenant_header: bool, prices: PriceTable | None = None) -> PolicySet | None:
        """The compiled budgets (their money limits priced by `prices`), None when disabled.
        Raises ValueError."""
        if not self.enabled:
            return None
        if not self.config:
            raise ValueError("--tenant-rate-limit-enabled needs --tenant-rate-limit-config FILE")
        return load_policy(Path(self.config), trust_tenant_header=trust_tenant_header, prices=prices)

    def ledger(self, shared: SharedStateConfig | None = None) -> Ledger:
        """Where the budgets live. Raises ValueError when the state file cannot be opened."""
        if self.state == IN_MEMORY:
            return MemoryLedger()
        if is_redis_url(self.state):
            fail_open = shared is not None and shared.fail_open
            down = "tenant budgets " + ("admit uncharged" if fail_open else "refuse with 503") + " until it returns"
            return RedisLedger(link(self.state, down), fail_open=fail_open)
        try:
            return SqliteLedger(Path(self.state))
        except sqlite3.Error as exc:
            raise ValueError(f"--tenant-rate-limit-state {self.state}: {exc}") from None


def exceeded(decision: Decision) -> Refused:
    if decision.unavailable:
        return shared_state_unavailable("the shared tenant budgets are unreachable")
    headers = {"Retry-After": str(decision.retry_after)} if decision.retry_after else {}
    return Refused(
        429, "Tenant rate limit exceeded for this request", code="tenant_rate_limit_exceeded", headers=headers
    )


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one request was charged at admission."""

    decision: Decision
    scopes: list[Scope]
    tokens: int
    dollars: float = 0.0  # the prompt at the model's input price, when a scope is stated in money
    price: Price | None = None  # the model's, when a scope is stated in money


class Budgets:
    """The policy, the ledger and the prices: reserve and settle for one tenant and model."""

    def __init__(
        self,
        policy: PolicySet,
        ledger: Ledger,
        clock: Callable[[], float] = time.time,
        prices: PriceTable | None = None,
    ) -> None:
        self.policy = policy
        self.ledger = ledger
        self.prices = prices
        self._clock = clock

    async def reserve(self, tenant: str, model: str, tokens: int) -> Reservation:
        scopes = self.policy.scopes(tenant, model)
        price = None
        if self.prices is not None and any(s.limits.dollars_per_minute is not None for s in scopes):
            price = self.prices.price(model)  # the policy was refused at start if it has none
        dollars = price.cost(tokens, 0) if price is not None else 0.0
        decision = await self.ledger.reserve(scopes, tokens, self._clock(), dollars)
        return Reservation(decision, scopes, tokens, dollars, price)

    async def settle(self, reservation: Reservation, delta: int, usage: dict[str, int]) -> float | None:
        """True the reservation up: `delta` tokens more, and the cost of `usage` (the final
        counts) less the dollars reserved. Returns that cost, None when no scope is stated in
        money."""
        price = reservation.price
        cost = None
        dollars = 0.0
        if price is not None:
            cost = price.cost(
                usage.get("input_tokens", 0),
                usage.get("output_tokens", 0),
                usage.get("cache_read_input_tokens", 0),
                usage.get("cache_creation_input_tokens", 0),
            )
            dollars = cost - reservation.dollars
        if delta or dollars:
            await self.ledger.settle(reservation.scopes, delta, self._clock(), dollars)
        return cost

    def close(self) -> None:
        self.ledger.close()


def _decision(decision: Decision) -> str:
    if decision.allowed:
        return "admitted"
    return "unavailable" if decision.unavailable else "denied"


def _charged(call: Call) -> bool:
    return call.endpoint == "messages" and getattr(call.request, "max_tokens", 0) > 0


def _usage(payload: dict[str, Any], key: str) -> int | None:
    usage = payload.get("usage")
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cache_usage(payload: dict[str, Any], into: dict[str, int]) -> None:
    for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        value = _usage(payload, key)
        if value is not None:
            into[key] = value


def budget_layer(budgets: Budgets, generates: Callable[[str], bool]) -> Callable[[Handler], Handler]:
    """The budget gate. `generates(backend)`: whether the connector a `routed` event names
    generates the answer itself (`smg.backends.base.Connector.generates`): only those are
    charged, since only they know the prompt's tokens before the engine is called."""

    def layer(inner: Handler) -> Handler:
        async def handle(call: Call) -> AsyncGenerator[Event, None]:
            if not _charged(call):
                async with aclosing(inner(call)) as events:
                    async for event in events:
                        yield event
                return
            tenant = call.tenant or "anonymous"
            charged = False
            scopes: list[Scope] | None = None
            reservation: Reservation | None = None
            reserved = 0
            open_ = False  # reserved and not yet settled
            input_tokens: int | None = None
            cache: dict[str, int] = {}  # the prompt's cache reads and writes, as message_start says
            routed: list[Routed] = []  # held back until the budget admits the request (PD: each leg's)
            async with aclosing(inner(call)) as events:
                async for event in events:
                    if isinstance(event, Routed) and scopes is None and generates(event.backend):
                        charged = True
                        routed.append(event)
                        continue
                    if isinstance(event, Rendered) and scopes is None and charged:
                        # The engine has not been called yet: the connector waits at this event.
                        reservation = await budgets.reserve(tenant, call.model, event.prompt_tokens)
                        decision, scopes = reservation.decision, reservation.scopes
                        reserved = event.prompt_tokens
                        if decision.allowed:
                            for held in routed:
                                yield held
                        yield event
                        yield Admission(
                            gate="tenant_rate_limit",
                            decision=_decision(decision),
                            tenant=tenant,
                            reserved_tokens=reserved if decision.allowed else None,
                            retry_after=decision.retry_after,
                            prompt_usd=reservation.dollars if reservation.price is not None else None,
                        )
                        if not decision.allowed:
                            raise exceeded(decision)  # no worker was called: none is journaled
                        open_ = True
                        continue
                    if isinstance(event, Block) and open_ and reservation is not None:
                        kind = event.event.get("type")
                        if kind == "message_start" and isinstance(event.event.get("message"), dict):
                            input_tokens = _usage(event.event["message"], "input_tokens") or input_tokens
                            _cache_usage(event.event["message"], cache)
                        elif kind == "message_delta" and (output := _usage(event.event, "output_tokens")) is not None:
                            # The final usage: settled before the client can see the response end,
                            # so its next request meets the trued-up budget.
                            used_input = _usage(event.event, "input_tokens") or input_tokens or reserved
                            delta = used_input + output - reserved
                            _cache_usage(event.event, cache)
                            usage = {"input_tokens": used_input, "output_tokens": output, **cache}
                            cost = await budgets.settle(reservation, delta, usage)
                            money = reservation.price is not None
                            yield Settled(
                                tenant=tenant,
                                reserved_tokens=reserved,
                                input_tokens=used_input,
                                output_tokens=output,
                                delta=delta,
                                reserved_usd=reservation.dollars if money else None,
                                cost_usd=cost,
                                delta_usd=cost - reservation.dollars if cost is not None else None,
                            )
                            open_ = False
                    yield event

        return handle

    return layer
