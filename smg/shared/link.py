"""One Redis server as the replicas see it: a client made lazily in the serving event loop
(so a `--workers N` fork never shares a socket), and whether the server answers.

A command whose connection the server closed (a pooled one, after the server restarted) is
sent again once, at once, on a new connection; one that timed out never is (the script may
have run and only its answer been lost: it must not run twice). A failed command is counted,
and the first failure after a success logs ONE line naming the server and what the gateway
does meanwhile (`--redis-failure-mode`). From then on the server is known down: commands
fail at once, without being sent (a request never waits on a server known to be away),
while a background probe PINGs it with backoff (0.25 s doubling to 5 s); its first answer
logs that the server is back, and commands are sent again.
`smg_redis_up` and `smg_redis_errors_total` (per server) are read from here at scrape time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
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
# The background probe of a server known down: its first wait, doubled after each miss up to the last.
PROBE_FIRST_SECS = 0.25
PROBE_MAX_SECS = 5.0
# A subscription idle this long is PINGed; one whose PING goes unanswered as long again is dead
# (a NAT or load balancer that dropped the idle connection leaves it half-open, silent forever).
HEALTH_CHECK_SECS = 2.0


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
        self._scripts: dict[str, Any] = {}
        self._probe: asyncio.Task[None] | None = None

    @property
    def client(self) -> Any:
        """The `redis.asyncio.Redis` client, made on first use in the running loop."""
        if self._client is None:
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
            from redis.exceptions import ConnectionError as RedisConnectionError

            self._client = aioredis.Redis.from_url(
                self.url,
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
                socket_timeout=_SOCKET_TIMEOUT_SECS,
                socket_connect_timeout=_SOCKET_TIMEOUT_SECS,
                decode_responses=True,
            )
        return self._client

    def pubsub_client(self) -> Any:
        """A client of its own for a subscription: its reads wait for messages as long as
        `messages` says, which PINGs it when idle."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        return aioredis.Redis.from_url(
            self.url,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=_SOCKET_TIMEOUT_SECS,  # the handshake and commands; reads say their own
            socket_connect_timeout=_SOCKET_TIMEOUT_SECS,
            decode_responses=True,
        )

    async def run(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a Lua script (EVALSHA, loaded again on NOSCRIPT) once. Raises SharedStateDown
        at once, sending nothing, while the server is known down."""
        if self.up is False:
            self.errors += 1
            raise SharedStateDown(f"redis {self.target} is unreachable")
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self.client.register_script(source)
        try:
            result = await script(keys=list(keys), args=list(args), client=self.client)
        except redis_errors() as exc:
            raise self.failed(exc) from None
        self.answered()
        return result

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
        self._start_probe()
        return SharedStateDown(str(exc))

    def _start_probe(self) -> None:
        if self._probe is not None and not self._probe.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._probe = loop.create_task(self._probe_until_up(), name=f"smg-redis-probe {self.target}")

    async def _probe_until_up(self) -> None:
        wait = PROBE_FIRST_SECS
        while self.up is False:
            await asyncio.sleep(wait)
            try:
                await self.client.ping()
            except redis_errors():
                wait = min(wait * 2, PROBE_MAX_SECS)
                continue
            self.answered()

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        self._scripts.clear()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


async def messages(pubsub: Any) -> AsyncIterator[dict[str, Any]]:
    """A subscription's published messages, until its connection fails: raises ConnectionError
    when a PING sent after `HEALTH_CHECK_SECS` of silence is not answered within as long. The
    subscription must not ignore subscribe messages (its PONGs would be ignored with them)."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    loop = asyncio.get_running_loop()
    pinged_at: float | None = None
    while True:
        message = await pubsub.get_message(timeout=HEALTH_CHECK_SECS)
        if message is not None:
            pinged_at = None  # anything heard, a PONG included, shows the connection lives
            if message.get("type") == "message":
                yield message
            continue
        now = loop.time()
        if pinged_at is None:
            await pubsub.ping()
            pinged_at = now
        elif now - pinged_at >= HEALTH_CHECK_SECS:
            raise RedisConnectionError("the subscription's connection did not answer a PING")


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
