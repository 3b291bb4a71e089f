"""The router's settings: one typed value per component (policy, retries, circuit breaker,
health checks), each declared once with its defaults, assembled by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field

from smg.flags import option
from smg.routing.breaker import BreakerConfig
from smg.routing.policies import POLICY_NAMES
from smg.routing.policies.base import PolicyConfig
from smg.routing.retry import RetryConfig
from smg.routing.worker_urls import WorkerUrlConfig
from smg.routing.workers import HealthConfig


@dataclass(frozen=True)
class RouterConfig:
    policy: str = field(
        default="cache_aware",
        metadata=option("--policy", "How a worker is chosen within a pool.", choices=POLICY_NAMES),
    )
    prefill_policy: str | None = field(
        default=None,
        metadata=option(
            "--prefill-policy", "PD: the prefill workers' policy (default: --policy).", choices=POLICY_NAMES
        ),
    )
    decode_policy: str | None = field(
        default=None,
        metadata=option(
            "--decode-policy", "PD: the decode workers' policy (default: --policy).", choices=POLICY_NAMES
        ),
    )
    encode_policy: str | None = field(
        default=None,
        metadata=option(
            "--encode-policy",
            "EPD: the encode workers' policy, one choice per image keyed by its content hash (default: --policy).",
            choices=POLICY_NAMES,
        ),
    )
    policies: PolicyConfig = field(default_factory=PolicyConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    urls: WorkerUrlConfig = field(default_factory=WorkerUrlConfig)
    igw: bool = field(
        default=False,
        metadata=option("--enable-igw", "Serve several kinds of workers and models at once (gRPC, HTTP, external)."),
    )
    pd: bool = field(
        default=False,
        metadata=option("--pd-disaggregation", "Prefill/decode deployments: --prefill URL [PORT] and --decode URL."),
    )
    epd: bool = field(
        default=False,
        metadata=option(
            "--epd-disaggregation",
            "Encode/prefill/decode deployments over gRPC (TokenSpeed): --encode URL [PORT], --prefill, --decode.",
        ),
    )
    dp_aware: bool = field(
        default=False,
        metadata=option(
            "--dp-aware",
            "Data-parallel aware: a worker whose engine has N data-parallel ranks (an SGLang HTTP worker's "
            "/server_info dp_size; a gRPC worker's GetServerInfo) is served as N rank-pinned workers (URL@rank).",
        ),
    )
    dp_minimum_tokens_scheduler: bool = field(
        default=False,
        metadata=option(
            "--dp-minimum-tokens-scheduler",
            "With --dp-aware: the rank of the chosen engine is the one whose engine reports the fewest KV-cache "
            "tokens in use (GetLoads), counting what was sent since.",
        ),
    )
    worker_registry: str | None = field(
        default=None,
        metadata=option(
            "--worker-registry",
            "redis://HOST:PORT/DB: workers added or removed through /workers on any replica naming this server "
            "are routed to by all of them (the --worker-urls stay each replica's own).",
        ),
    )
    runtime: str | None = None  # --backend/--runtime: the engine runtime of gRPC workers, else detected
