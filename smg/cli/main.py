"""The `smg` command: `smg launch` starts the gateway; `smg journal …` reads what it recorded;
`smg replay` re-runs a recorded request; `smg inspect` browses the journal live."""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

import typer

from smg.admission import COMPONENTS as ADMISSION_COMPONENTS
from smg.admission import ConcurrencyConfig, RateLimitConfig, TenantConfig
from smg.backends.grpc.config import EngineConfig
from smg.cli import lazy
from smg.cli.options import build_component, with_component_flags
from smg.config import GatewayConfig, JournalBufferConfig, ProcessConfig
from smg.fetch.config import FetchConfig
from smg.journal_sink import SinkConfig
from smg.observability.config import ObservabilityConfig
from smg.pipeline.media import MediaConfig
from smg.routing.breaker import BreakerConfig
from smg.routing.config import RouterConfig
from smg.routing.policies import PolicyConfig
from smg.routing.retry import RetryConfig
from smg.routing.worker_urls import WorkerUrlConfig
from smg.routing.workers import HealthConfig
from smg.shared.link import SharedStateConfig

# `journal`, `engine`, `journal-sink`, `replay` and `inspect` are imported when named (`smg.cli.lazy`).
app = lazy.root()

# Flags of the reference gateway that take several values after one flag (`--worker-urls a b`).
_MULTI_VALUE = (
    "--worker-urls",
    "--cors-allowed-origins",
    "--model-alias",
    "--routing-key-headers",
    "--prometheus-duration-buckets",
    "--ipc-dir",
    "--fetch-allow",
)
# The components: their flags are declared on their settings (`smg.flags.option`).
_COMPONENTS = (
    RouterConfig,
    EngineConfig,
    PolicyConfig,
    RetryConfig,
    BreakerConfig,
    HealthConfig,
    WorkerUrlConfig,
    *ADMISSION_COMPONENTS,
    ObservabilityConfig,
    FetchConfig,
    MediaConfig,
    SinkConfig,
    JournalBufferConfig,
)
# Every `smg launch` setting, declared on the settings it fills: the gateway's own, the launching
# process's, then the components'.
_SETTINGS = (GatewayConfig, ProcessConfig, *_COMPONENTS)


def router_config(params: dict[str, Any]) -> RouterConfig:
    """The router's settings from the parsed `smg launch` flags."""
    return build_component(
        RouterConfig,
        params,
        policies=build_component(PolicyConfig, params),
        retry=build_component(RetryConfig, params),
        breaker=build_component(BreakerConfig, params),
        health=build_component(HealthConfig, params),
        urls=build_component(WorkerUrlConfig, params),
    )

# Flags of the reference gateway this build knows of but does not serve yet: refused by name,
# never ignored.
NOT_YET = {
    "--rate-limit-tokens-per-second": "a refilling admission bucket",
    "--priority-scheduler-enabled": "the priority admission scheduler",
    "--priority-scheduler-config": "the priority admission scheduler",
    "--stream-request-bodies-over": "streamed-through request bodies",
}


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def expand_multi_values(argv: list[str]) -> list[str]:
    """`--worker-urls a b c` → `--worker-urls a --worker-urls b --worker-urls c`."""
    out: list[str] = []
    flag: str | None = None
    for arg in argv:
        if arg.startswith("-"):
            flag = arg if arg in _MULTI_VALUE else None
            out.append(arg)
            continue
        if flag and out and out[-1] != flag and not out[-1].startswith("-"):
            out.append(flag)
        out.append(arg)
    return out


def join_bootstrap_ports(argv: list[str]) -> list[str]:
    """`--prefill URL 9000` → `--prefill 'URL 9000'`: the reference's optional bootstrap port (or
    `none`) after a prefill (or encode) URL, kept with its URL."""
    out: list[str] = []
    for arg in argv:
        if len(out) >= 2 and out[-2] in ("--prefill", "--encode") and (arg.isdigit() or arg.lower() == "none"):
            out[-1] = f"{out[-1]} {arg}"
            continue
        out.append(arg)
    return out


def main() -> None:
    app(args=join_bootstrap_ports(expand_multi_values(sys.argv[1:])), prog_name="smg")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@with_component_flags(*_SETTINGS)
def launch(ctx: typer.Context, **flags: Any) -> None:
    """Start the gateway."""
    from smg.admission import build_admission
    from smg.cli.launch import LaunchError, build_config, run

    for extra in ctx.args:
        name = extra.split("=", 1)[0]
        if name in NOT_YET:
            raise typer.BadParameter(f"{name}: {NOT_YET[name]} is not supported by this gateway yet", param_hint=name)
        if name.startswith("-"):
            raise typer.BadParameter(f"no such option: {name}", param_hint=name)
        raise typer.BadParameter(f"unexpected argument {extra!r}")
    from smg.observability import logs

    observability = build_component(ObservabilityConfig, flags)
    log_level = str(flags["log_level"]).lower()
    logs.configure(log_level if log_level in _LOG_LEVELS else "info", observability.log_json)
    # The upstream client would log every request at INFO: far too much on the hot path.
    for noisy in ("httpx", "httpcore", "httpx2", "mcp"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        try:
            process = build_component(ProcessConfig, flags)
            router = router_config(flags)
            from smg.admission.tenants import load_tenant_secret

            api_key = flags["api_key"] or None
            journal_path = None if process.no_journal else flags["journal"]
            admission = build_admission(
                api_key,
                tenant_secret=load_tenant_secret(journal_path) if api_key else None,
                tenants=build_component(TenantConfig, flags),
                concurrency=build_component(ConcurrencyConfig, flags),
                rate_limit=build_component(RateLimitConfig, flags),
                shared=build_component(SharedStateConfig, flags),
            )
            journal_buffer = build_component(JournalBufferConfig, flags)
            observability.check()
            fetch = build_component(FetchConfig, flags)
            fetch.policy()
            media = build_component(MediaConfig, flags)
            media.check()
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        config = build_config(
            flags,
            journal_path=journal_path,
            router=router,
            engine=build_component(EngineConfig, flags),
            observability=observability,
            fetch=fetch,
            media=media,
            journal_buffer=journal_buffer,
        )
        from smg import journal_sink

        sink = build_component(SinkConfig, flags)
        try:
            journal_sink.prepare(sink, config.journal_path)
        except journal_sink.SinkError as exc:
            raise LaunchError(str(exc)) from None
        config = dataclasses.replace(config, journal_sink=sink)
    except LaunchError as exc:
        typer.echo(f"smg launch: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        run(config, admission, workers=process.workers)
    except LaunchError as exc:
        typer.echo(f"smg launch: {exc}", err=True)
        raise typer.Exit(2) from None
