"""The gateway's settings, as one immutable value built by the CLI and read by everyone else, and
the settings of the `smg launch` process that serves them."""

from __future__ import annotations

from collections.abc import Callable
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


def _aliases(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        alias, sep, canonical = pair.partition("=")
        if not sep or not alias or not canonical:
            raise ValueError(f"--model-alias takes ALIAS=CANONICAL, got {pair!r}")
        out[alias] = canonical
    return out


def _bootstrap_workers(flag: str) -> Callable[[list[str]], tuple[tuple[str, int | None], ...]]:
    """`URL` or `URL PORT` / `URL none` (the bootstrap port) per --prefill (or --encode)."""

    def parse(values: list[str]) -> tuple[tuple[str, int | None], ...]:
        out: list[tuple[str, int | None]] = []
        for value in values:
            url, _, port = value.partition(" ")
            if not port or port.lower() == "none":
                out.append((url, None))
            elif port.isdigit() and 0 < int(port) < 65536:
                out.append((url, int(port)))
            else:
                raise ValueError(f"{flag} takes URL [BOOTSTRAP_PORT], got {value!r}")
        return tuple(out)

    return parse


def _retention(spec: str) -> tuple[float | None, int | None]:
    from journal.retention import parse_retention

    try:
        return parse_retention(spec)
    except ValueError as exc:
        raise ValueError(f"--journal-retention: {exc}") from None


@dataclass(frozen=True)
class ProcessConfig:
    """What `smg launch` does with the gateway's settings: how many processes serve them, and
    whether the journal is kept at all (`--no-journal` empties `GatewayConfig.journal_path`)."""

    workers: int = field(
        default=1,
        metadata=option(
            "--workers", "Gateway processes sharing the listening socket and the journal file (default: 1)."
        ),
    )
    no_journal: bool = field(default=False, metadata=option("--no-journal", "Record nothing."))

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("--workers must be at least 1")


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's settings. A field with `metadata=option(…)` is a `smg launch` flag, declared
    here once (`smg.cli.options` makes the option and reads it back); `smg.cli.launch` checks how
    they combine."""

    host: str = field(default="0.0.0.0", metadata=option("--host", "Address to listen on."))
    port: int = field(default=30000, metadata=option("--port", "Port to listen on."))
    worker_urls: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "--worker-urls", "Worker URLs; the scheme picks the kind: http(s):// (relay), grpc://, ipc:// (ZMQ)."
        ),
    )
    prefill_urls: tuple[tuple[str, int | None], ...] = field(
        default=(),
        metadata=option(
            "--prefill",
            "With --pd-disaggregation: a prefill worker, URL [BOOTSTRAP_PORT] (repeatable).",
            takes="list[str]",
            parse=_bootstrap_workers("--prefill"),
        ),
    )
    decode_urls: tuple[str, ...] = field(
        default=(), metadata=option("--decode", "With --pd-disaggregation: a decode worker URL (repeatable).")
    )
    encode_urls: tuple[tuple[str, int | None], ...] = field(  # EPD
        default=(),
        metadata=option(
            "--encode",
            "With --epd-disaggregation: an encode worker, URL [BOOTSTRAP_PORT] (repeatable).",
            takes="list[str]",
            parse=_bootstrap_workers("--encode"),
        ),
    )
    # An engine runtime for gRPC workers, or an API (anthropic).
    backend: str | None = field(
        default=None,
        metadata=option(
            "--backend", "Engine runtime or API backend (e.g. sglang, vllm).", aliases=("--runtime",)
        ),
    )
    model_path: str | None = field(
        default=None,
        metadata=option("--model-path", "Model path for the tokenizer (gRPC/ZMQ workers).", aliases=("--model",)),
    )
    tokenizer_path: str | None = field(
        default=None, metadata=option("--tokenizer-path", "Tokenizer path, if not the model path.")
    )
    model_aliases: dict[str, str] = field(
        default_factory=dict,
        metadata=option(
            "--model-alias",
            "ALIAS=CANONICAL: serve CANONICAL under another name (repeatable).",
            takes="list[str]",
            parse=_aliases,
        ),
    )
    api_key: str | None = field(
        default=None,
        metadata=option(
            "--api-key",
            "Require `Authorization: Bearer <key>` from clients.",
            envvar="SMG_API_KEY",
            parse=lambda key: key or None,
        ),
    )
    cors_allowed_origins: tuple[str, ...] = field(
        default=(), metadata=option("--cors-allowed-origins", "Origins allowed cross-origin (default: any).")
    )
    # One deadline per request, every attempt included.
    request_timeout_secs: float = field(
        default=1800.0,
        metadata=option(
            "--request-timeout-secs",
            "Each request's deadline, every attempt included (504 timeout_error past it).",
        ),
    )
    # A request's head and body, read whole, from its first byte.
    header_read_timeout_secs: float = field(
        default=30.0,
        metadata=option(
            "--header-read-timeout-secs",
            "A request's head and body must arrive whole within this, from accept (a kept-alive "
            "connection's next request: from its first byte; it waits no longer than this for it).",
        ),
    )
    # Open client connections; None: from the descriptor limit.
    max_connections: int | None = field(
        default=None,
        metadata=option(
            "--max-connections",
            "Open client connections at most; more are answered 503 (default: from the fd limit).",
        ),
    )
    log_level: str = field(
        default="info", metadata=option("--log-level", "debug, info, warning or error.", parse=str.lower)
    )
    # None: --no-journal (ProcessConfig).
    journal_path: Path | None = field(
        default=Path("smg-journal.db"),
        metadata=option("--journal", "SQLite journal file.", envvar="SMG_JOURNAL"),
    )
    journal_retention: tuple[float | None, int | None] | None = field(  # (max age s, max bytes)
        default=None,
        metadata=option(
            "--journal-retention",
            "Prune the journal to an age and/or size, checked every minute: 7d, 500MB, 7d,2GB.",
            takes="str",
            parse=_retention,
        ),
    )
    journal_bodies: str = field(  # journal.bodies
        default="full",
        metadata=option(
            "--journal-bodies", "What the journal keeps of content: full, redacted (fingerprints) or none."
        ),
    )
    journal_buffer: JournalBufferConfig = field(default_factory=JournalBufferConfig)
    prices: PriceTable | None = None  # --price-table (smg.spend): each completed request's cost
    max_payload_size: int = field(
        default=536_870_912, metadata=option("--max-payload-size", "Largest request body, in bytes.")
    )
    router: RouterConfig = field(default_factory=RouterConfig)  # workers, policies, retries, breakers, health
    request_id_headers: tuple[str, ...] = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")
    upstream_transport: str = field(  # measured faster: see tools/bench and the README
        default="aiohttp",
        metadata=option(
            "--upstream-transport", "Upstream HTTP client transport: aiohttp (faster, see make bench) or httpx."
        ),
    )
    mcp_config_path: Path | None = field(  # the MCP tool loop's policy (Anthropic backend)
        default=None,
        metadata=option(
            "--mcp-config-path",
            "MCP tool loop policy file, YAML or JSON (see smg.mcp.config); --backend anthropic.",
        ),
    )
    chat_template: Path | None = field(  # overrides the tokenizer's template (gRPC workers)
        default=None,
        metadata=option("--chat-template", "Jinja chat template file overriding the tokenizer's (gRPC workers)."),
    )
    tool_call_parser: str | None = field(  # gRPC: else detected from the model id
        default=None,
        metadata=option(
            "--tool-call-parser", "gRPC workers: the model's tool-call format (default: from the model id)."
        ),
    )
    reasoning_parser: str | None = field(  # gRPC: else detected from the model id
        default=None,
        metadata=option(
            "--reasoning-parser", "gRPC workers: the model's reasoning format (default: from the model id)."
        ),
    )
    # Fetch a tokenizer from a gRPC worker when none is configured.
    tokenizer_autoload: bool = field(
        default=True,
        metadata=option(
            "--disable-tokenizer-autoload",
            "Never fetch a tokenizer from a gRPC worker: only --model-path, --tokenizer-path or "
            "POST /v1/tokenizers register one.",
            invert=True,
        ),
    )
    zmq_engine_count: int = field(  # data-parallel engines dialling each ipc:// worker
        default=1,
        metadata=option(
            "--zmq-engine-count", "ipc:// (ZMQ) workers: the data-parallel engines that dial each worker."
        ),
    )
    engine: EngineConfig = field(default_factory=EngineConfig)  # gRPC/ZMQ connector settings
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)  # metrics, traces, JSON logs
    # This gateway's id in the hop header (smg.protocol.hops); one per process group: the
    # processes of `--workers N` share it, since the settings are built before they fork.
    instance_id: str = field(default_factory=instance_id)
    fetch: FetchConfig = field(default_factory=FetchConfig)  # where client-named URLs may lead (--fetch-allow)
    media: MediaConfig = field(default_factory=MediaConfig)  # a request's image count, fetch deadline and budget
    journal_sink: SinkConfig = field(default_factory=SinkConfig)  # --journal-sink, --replica-name

    def canonical_model(self, name: str) -> str:
        """Resolve a `--model-alias` name to its canonical model id (case-sensitive)."""
        return self.model_aliases.get(name, name)
