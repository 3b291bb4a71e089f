"""The settings of metrics, tracing and logs, with their `smg launch` flags (the reference's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from smg.flags import option

# The reference gateway's buckets for every `*_seconds` histogram.
DEFAULT_DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0,
    120.0, 180.0, 240.0, 300.0, 480.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0,
)  # fmt: skip


@dataclass(frozen=True)
class ObservabilityConfig:
    """`--prometheus-host`/`--prometheus-port`/`--prometheus-duration-buckets`, `--enable-trace`
    with `--otlp-traces-endpoint`, and `--log-json`."""

    prometheus_port: int | None = field(
        default=None,
        metadata=option(
            "--prometheus-port",
            "Serve Prometheus metrics at /metrics on this port (a listener of its own; off when not given).",
        ),
    )
    prometheus_host: str = field(
        default="0.0.0.0", metadata=option("--prometheus-host", "Address the metrics listener binds.")
    )
    prometheus_duration_buckets: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "--prometheus-duration-buckets", "Bucket bounds in seconds of the duration histograms (several values)."
        ),
    )
    enable_trace: bool = field(
        default=False, metadata=option("--enable-trace", "Export OpenTelemetry spans of each request over OTLP.")
    )
    otlp_traces_endpoint: str = field(
        default="localhost:4317",
        metadata=option("--otlp-traces-endpoint", "The OTLP/gRPC collector, HOST:PORT (with --enable-trace)."),
    )
    log_json: bool = field(
        default=False,
        metadata=option("--log-json", "Log one JSON object per line, and one line per request with its outcome."),
    )

    def buckets(self) -> tuple[float, ...]:
        """The duration buckets, checked. Raises `ValueError`."""
        if not self.prometheus_duration_buckets:
            return DEFAULT_DURATION_BUCKETS
        try:
            values = tuple(float(v) for v in self.prometheus_duration_buckets)
        except ValueError:
            raise ValueError(
                f"--prometheus-duration-buckets takes numbers, got {' '.join(self.prometheus_duration_buckets)}"
            ) from None
        if any(b <= 0 for b in values) or list(values) != sorted(set(values)):
            raise ValueError("--prometheus-duration-buckets must be positive and increasing")
        return values

    def check(self) -> None:
        """Raises `ValueError` for settings that cannot work."""
        self.buckets()
        if self.prometheus_port is not None and not 0 < self.prometheus_port < 65536:
            raise ValueError("--prometheus-port must be between 1 and 65535")
        host, sep, port = self.otlp_traces_endpoint.rpartition(":")
        if self.enable_trace and (not sep or not host or not port.isdigit()):
            raise ValueError(f"--otlp-traces-endpoint takes HOST:PORT, got {self.otlp_traces_endpoint!r}")
