"""One Redis server as the replicas see it: a client made lazily in the serving event loop
(so a `--workers N` fork never shares a socket), and whether the server answers.

A failed command is sent again once at once, on a new connection (a pooled one is dead after
the server restarted), never after a backoff (a request would stall for it); then it is
counted, and the first failure after a success logs ONE line naming the server and what the
gateway does meanwhile (`--redis-failure-mode`); the first success after a failure logs that
it is back. `smg_redis_up` and `smg_redis_errors_total` (per server) are
read from here at scrape time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from smg.flags import option

log = logging.getLogger("smg.redis")

FAILURE_MODES = ("closed", "open")
_SCHEMES = ("redis", "rediss", "unix")
# A command's longest wait: a server that accepts and never answers costs a request this much.
_SOCKET_TIMEOUT_SECS = 2.0


def is_redis_url(value: str | None) -> bool:
    return bool(value) and urlsplit(value or "").scheme in _SCHEMES


@dataclass(frozen=True)
class SharedStateConfig:
    """`--redis-failure-mode`, `--fleet-lease-secs`: how shared admission state behaves."""

    failure_mode: str = field(
        default="closed",
        metadata=option(
            "--redis-failure-mode",
            "With Redis unreachable, tenant budgets and fleet-wide slots refuse (closed: 503 "
            "shared_state_unavailable) or admit uncounted (open).",
            choices=FAILURE_MODES,
        ),
    )
    lease_secs: float = field(
        default=10.0,
        metadata=option(
            "--fleet-lease-secs",
            "--fleet-concurrency: how long a replica's slots outlive its last heartbeat (renewed every third of it).",
        ),
    )

    @property
    def fail_open(self) -> bool:
        return self.failure_mode == "open"

    def check(self) -> None:
        """Raises ValueError for settings that cannot work."""
        if self.failure_mode not in FAILURE_MODES:
            raise ValueError(f"--redis-failure-mode must be one of {', '.join(FAILURE_MODES)}")
        if self.lease_secs < 1:
            raise ValueError("--fleet-lease-secs must be at least 1")


class SharedStateDown(Exception):
    """Redis did not answer a command (already counted and logged by its link)."""


def _target(url: str) -> str:
    """The server without its credentials, for logs and metric labels."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    return f"{parts.scheme}://{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path or '/0'}"


class RedisLink:
    """A Redis server shared by the replicas, and its health as this process sees it."""

    def __init__(self, url: str, on_down: str = "") -> None:
        if not is_redis_url(url):
            raise ValueError(f"{url!r} is not a Redis URL (redis://HOST:PORT/DB, rediss://…, unix://PATH)")
        self.url = url
        self.target = _target(url)
        self.on_down = on_down  # what the gateway does while the server is away, for the log line
        self.up: bool | None = None  # unknown until the first command
        self.errors = 0
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The `redis.asyncio.Redis` client, made on first use in the running loop."""
        if self._client is None:
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            self._client = aioredis.Redis.from_url(
                self.url,
                retry=Retry(NoBackoff(), 1),
                socket_timeout=_SOCKET_TIMEOUT_SECS,
                socket_connect_timeout=_SOCKET_TIMEOUT_SECS,
                decode_responses=True,
            )
        return self._client

    def pubsub_client(self) -> Any:
        """A client of its own for a subscription: it blocks reading, so no socket timeout."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        return aioredis.Redis.from_url(
            self.url,
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=_SOCKET_TIMEOUT_SECS,
            decode_responses=True,
        )

    def answered(self) -> None:
        if self.up is False:
            log.warning("redis %s is reachable again", self.target)
        self.up = True

    def failed(self, exc: BaseException) -> SharedStateDown:
        """Count a failed command; the first failure after a success is logged, once."""
        self.errors += 1
        if self.up is not False:
            suffix = f"; {self.on_down}" if self.on_down else ""
            log.error("redis %s is unreachable (%s)%s", self.target, exc or type(exc).__name__, suffix)
        self.up = False
        return SharedStateDown(str(exc))

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def redis_errors() -> tuple[type[BaseException], ...]:
    """What a command raises when the server is away or refuses (connection, timeout, LOADING…)."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


_links: dict[str, RedisLink] = {}


def link(url: str, on_down: str = "") -> RedisLink:
    """The process's link to `url` (one per server, whatever uses it). Raises ValueError."""
    found = _links.get(url)
    if found is None:
        found = _links[url] = RedisLink(url, on_down)
    elif on_down and on_down not in found.on_down:
        found.on_down = f"{found.on_down}; {on_down}" if found.on_down else on_down
    return found


def links() -> list[RedisLink]:
    return list(_links.values())


async def close_all() -> None:
    for each in links():
        await each.close()


class RedisCollector(Collector):
    """`smg_redis_up` and `smg_redis_errors_total` for every Redis server this process uses."""

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        if not _links:
            return
        up = GaugeMetricFamily(
            "smg_redis_up", "1 while the shared-state Redis answers, 0 while not", labels=("server",)
        )
        errors = CounterMetricFamily(
            "smg_redis_errors", "Redis commands that failed (server away, timeout, refused)", labels=("server",)
        )
        for each in _links.values():
            up.add_metric((each.target,), 0 if each.up is False else 1)
            errors.add_metric((each.target,), each.errors)
        yield up
        yield errors
