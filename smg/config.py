"""The gateway's settings, as one immutable value built by the CLI and read by everyone else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RetryConfig:
    """Upstream retries for relay backends (statuses 408, 429, 500, 502, 503, 504 and
    transport failures, re-selecting a worker each time)."""

    max_retries: int = 5
    initial_backoff_ms: int = 50
    max_backoff_ms: int = 30_000
    backoff_multiplier: float = 1.5
    jitter_factor: float = 0.2


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "0.0.0.0"
    port: int = 30000
    worker_urls: tuple[str, ...] = ()
    backend: str | None = None
    model_path: str | None = None
    tokenizer_path: str | None = None
    model_aliases: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    cors_allowed_origins: tuple[str, ...] = ()
    request_timeout_secs: float = 1800.0
    log_level: str = "info"
    journal_path: Path | None = Path("smg-journal.db")
    journal_bodies: str = "full"  # full | redacted | none (journal.bodies)
    journal_retention: tuple[float | None, int | None] | None = None  # (max age s, max bytes)
    max_payload_size: int = 536_870_912
    retry: RetryConfig | None = field(default_factory=RetryConfig)
    health_check_interval_secs: float = 30.0
    request_id_headers: tuple[str, ...] = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")
    upstream_transport: str = "aiohttp"  # measured faster: see tools/bench and the README
    mcp_config_path: Path | None = None  # the MCP tool loop's policy (Anthropic backend)
    chat_template: Path | None = None  # overrides the tokenizer's template (gRPC workers)
    tokenizer_autoload: bool = True  # fetch a tokenizer from a gRPC worker when none is configured
    tool_call_parser: str | None = None  # gRPC: else detected from the model id
    reasoning_parser: str | None = None  # gRPC: else detected from the model id

    def canonical_model(self, name: str) -> str:
        """Resolve a `--model-alias` name to its canonical model id (case-sensitive)."""
        return self.model_aliases.get(name, name)
