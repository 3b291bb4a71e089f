"""A worker as the router sees it: where it is, how it is reached, what it serves, its role,
and its state (health, circuit breaker, requests in flight).

Connectors report what a worker serves and whether it answered; the state transitions live
here, sans I/O: a refused connection takes a worker out at once, health checks bring it back
after `success_threshold` good answers and take it out after `failure_threshold` bad ones.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from smg.flags import option
from smg.routing.breaker import BreakerConfig, CircuitBreaker

log = logging.getLogger("smg.workers")

Connection = Literal["http", "grpc", "zmq"]
Role = Literal["regular", "prefill", "decode", "encode"]
ROLES: tuple[Role, ...] = ("regular", "prefill", "decode", "encode")
ENGINE_RUNTIMES = ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")
PROVIDERS = ("anthropic", "openai", "gemini", "xai")


def worker_kind(url: str) -> Connection:
    """The connection mode a URL's scheme names: `http`, `grpc` or `zmq`."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        return "http"
    if scheme == "grpc":
        return "grpc"
    if scheme == "ipc":
        return "zmq"
    raise ValueError(f"unsupported worker URL scheme {scheme!r} in {url!r} (use http://, https://, grpc:// or ipc://)")


def worker_id() -> str:
    """A new worker id: a UUIDv7 (time-ordered, as the reference gateway's)."""
    millis = time.time_ns() // 1_000_000
    value = (millis & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


@dataclass(frozen=True)
class HealthConfig:
    """How workers are probed (HTTP workers' `/health`, gRPC engines' `HealthCheck`)."""

    enabled: bool = field(
        default=True,
        metadata=option("--disable-health-check", "No periodic health checks of healthy workers.", invert=True),
    )
    interval_secs: float = field(
        default=60.0, metadata=option("--health-check-interval-secs", "Seconds between health checks.")
    )
    timeout_secs: float = field(default=5.0, metadata=option("--health-check-timeout-secs", "One check's limit."))
    endpoint: str = field(default="/health", metadata=option("--health-check-endpoint", "HTTP workers' health path."))
    failure_threshold: int = field(
        default=3, metadata=option("--health-failure-threshold", "Failed checks in a row that take a worker out.")
    )
    success_threshold: int = field(
        default=2, metadata=option("--health-success-threshold", "Passed checks in a row that bring it back.")
    )


@dataclass(eq=False)
class Worker:
    url: str
    connection: Connection
    runtime: str | None = None  # engine runtime, or the provider of an external worker; None until known
    role: Role = "regular"
    external: bool = False  # `runtime_type: external`: a provider's API (Anthropic, OpenAI, …)
    api_key: str | None = None
    bootstrap_port: int | None = None  # prefill workers of a PD deployment
    dp_rank: int | None = None  # --dp-aware: the data-parallel rank this worker stands for
    dp_size: int | None = None  # the ranks the engine behind `url` has, once discovered
    wildcard: bool = False  # serves any model (`--backend anthropic`: the API decides)
    prefixes: tuple[str, ...] = ()  # serves the models named so (an external provider's, list unknown)
    id: str = ""
    models: set[str] = field(default_factory=set)
    context_windows: dict[str, int] = field(default_factory=dict)
    healthy: bool = False
    discovered: bool = False
    last_error: str | None = None
    in_flight: int = 0  # requests the gateway has on this worker now
    engine_load: int | None = None  # what the engine itself reports (GetLoads), when it does
    # KV-cache tokens in use on the engine (its rank, for `url@rank`) as the last poll said, plus
    # what the data-parallel rank policy has sent it since; None when the engine does not say.
    kv_tokens: int | None = None
    removed: bool = False
    source: Literal["static", "api"] = "static"
    breaker: CircuitBreaker = field(default_factory=lambda: CircuitBreaker(BreakerConfig()))
    _good_checks: int = 0
    _bad_checks: int = 0

    def __post_init__(self) -> None:
        if not self.id:
            self.id = worker_id()

    @property
    def key(self) -> str:
        """The worker's name in the registry and the journal: `url`, or `url@rank` for one
        data-parallel rank of an engine (the reference's spelling)."""
        return self.url if self.dp_rank is None else f"{self.url}@{self.dp_rank}"

    @property
    def load(self) -> int:
        """What the load-aware policies compare. The engine's own count (when it reports one)
        includes this gateway's requests and any other client's, but it is polled: between two
        polls the gateway's live count may be the larger."""
        if self.engine_load is None:
            return self.in_flight
        return max(self.in_flight, self.engine_load)

    @property
    def available(self) -> bool:
        """Whether the router may send it a new request now."""
        return self.healthy and not self.removed and self.breaker.allows()

    def serves(self, model: str) -> bool:
        return self.wildcard or model in self.models or (bool(self.prefixes) and model.startswith(self.prefixes))

    def discovered_as(self, models: dict[str, int | None], healthy: bool, runtime: str | None = None) -> None:
        """What the worker said it serves; a worker that answers discovery is taken at its word."""
        self.models = set(models)
        self.context_windows = {m: w for m, w in models.items() if w}
        if runtime:
            self.runtime = runtime
        self.discovered = True
        self._set_health(healthy, None if healthy else "health check answered unhealthy")

    def unreachable(self, error: str) -> None:
        """Discovery failed: the worker stays out until it answers."""
        if error != self.last_error:
            log.warning("worker %s: %s (retrying)", self.url, error)
        self._set_health(False, error)

    def health_checked(self, ok: bool, error: str | None, config: HealthConfig) -> None:
        """A health check's outcome, counted against the thresholds."""
        if ok:
            self._good_checks += 1
            self._bad_checks = 0
            if not self.healthy and self._good_checks >= config.success_threshold:
                self._set_health(True, None)
        else:
            self._bad_checks += 1
            self._good_checks = 0
            self.last_error = error
            if self.healthy and self._bad_checks >= config.failure_threshold:
                self._set_health(False, error)

    def refused(self, error: str) -> None:
        """Nothing listens at the worker's address: out at once, back when a health check passes."""
        self._set_health(False, error)

    def _set_health(self, ok: bool, error: str | None) -> None:
        if ok != self.healthy:
            log.warning("worker %s is now %s", self.url, "healthy" if ok else f"unhealthy ({error})")
        self.healthy = ok
        self.last_error = error
        self._good_checks = self._bad_checks = 0
        if ok:
            self.breaker.readmit()
