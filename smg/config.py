"""The gateway's settings, as one immutable value built by the CLI and read by everyone else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from journal.prices import PriceTable
from smg.backends.grpc.config import EngineConfig
from smg.fetch.config import FetchConfig
from smg.flags import option
from smg.journal_sink import SinkConfig
from smg.observability.config import ObservabilityConfig
from smg.pipeline.media import MediaConfig
from smg.protocol.hops import instance_id
from smg.routing.config import RouterConfig


@dataclass(frozen=True)
class JournalBufferConfig:
    """What the journal holds in memory while its file takes no commits (a lock held by another
    process, a full disk): events are dropped only once this much is held."""

    journal_max_held: int = field(
        default=131072,
        metadata=option(
            "--journal-max-held",
            "Events the journal holds in memory while commits fail or wait on a lock (its queue included,"
            " at most half of it); beyond that new events are dropped and counted.",
        ),
    )

    def __post_init__(self) -> None:
        if self.journal_max_held < 2:
            raise ValueError("--journal-max-held must be at least 2")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "0.0.0.0"
    port: int = 30000
    worker_urls: tuple[str, ...] = ()
    prefill_urls: tuple[tuple[str, int | None], ...] = ()  # --prefill URL [BOOTSTRAP_PORT]
    decode_urls: tuple[str, ...] = ()  # --decode URL
    encode_urls: tuple[tuple[str, int | None], ...] = ()  # --encode URL [BOOTSTRAP_PORT] (EPD)
    backend: str | None = None  # --backend: an engine runtime for gRPC workers, or an API (anthropic)
    model_path: str | None = None
    tokenizer_path: str | None = None
    model_aliases: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    cors_allowed_origins: tuple[str, ...] = ()
    request_timeout_secs: float = 1800.0  # one deadline per request, every attempt included
    header_read_timeout_secs: float = 30.0  # a request's head and body, read whole, from its first byte
    max_connections: int | None = None  # open client connections; None: from the descriptor limit
    log_level: str = "info"
    journal_path: Path | None = Path("smg-journal.db")
    journal_bodies: str = "full"  # full | redacted | none (journal.bodies)
    journal_retention: tuple[float | None, int | None] | None = None  # (max age s, max bytes)
    journal_buffer: JournalBufferConfig = field(default_factory=JournalBufferConfig)
    prices: PriceTable | None = None  # --price-table (smg.spend): each completed request's cost
    max_payload_size: int = 536_870_912
    router: RouterConfig = field(default_factory=RouterConfig)  # workers, policies, retries, breakers, health
    request_id_headers: tuple[str, ...] = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")
    upstream_transport: str = "aiohttp"  # measured faster: see tools/bench and the README
    mcp_config_path: Path | None = None  # the MCP tool loop's policy (Anthropic backend)
    chat_template: Path | None = None  # overrides the tokenizer's template (gRPC workers)
    tokenizer_autoload: bool = True  # fetch a tokenizer from a gRPC worker when none is configured
    engine: EngineConfig = field(default_factory=EngineConfig)  # gRPC/ZMQ connector settings
    tool_call_parser: str | None = None  # gRPC: else detected from the model id
    reasoning_parser: str | None = None  # gRPC: else detected from the model id
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)  # metrics, traces, JSON logs
    zmq_engine_count: int = 1  # data-parallel engines dialling each ipc:// worker
    # This gateway's id in the hop header (smg.protocol.hops); one per process group: the
    # processes of `--workers N` share it, since the settings are built before they fork.
    instance_id: str = field(default_factory=instance_id)
    fetch: FetchConfig = field(default_factory=FetchConfig)  # where client-named URLs may lead (--fetch-allow)
    media: MediaConfig = field(default_factory=MediaConfig)  # a request's image count, fetch deadline and budget
    journal_sink: SinkConfig = field(default_factory=SinkConfig)  # --journal-sink, --replica-name

    def canonical_model(self, name: str) -> str:
        """Resolve a `--model-alias` name to its canonical model id (case-sensitive)."""
        return self.model_aliases.get(name, name)
