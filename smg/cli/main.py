"""The `smg` command: `smg launch` starts the gateway; `smg journal …` reads what it recorded;
`smg replay` re-runs a recorded request; `smg inspect` browses the journal live."""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from smg.admission import COMPONENTS as ADMISSION_COMPONENTS
from smg.admission import ConcurrencyConfig, RateLimitConfig, TenantConfig
from smg.backends.grpc.config import EngineConfig
from smg.cli.engine import engine_app
from smg.cli.inspect import inspect_command
from smg.cli.journal import journal_app
from smg.cli.options import build_component, with_component_flags
from smg.cli.replay import replay
from smg.cli.sink import sink_app
from smg.config import JournalBufferConfig
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
from smg.spend import SpendConfig

app = typer.Typer(
    help="smg: an Anthropic Messages API gateway with an event-sourced request journal.", no_args_is_help=True
)
app.add_typer(journal_app, name="journal")
app.add_typer(engine_app, name="engine")
app.add_typer(sink_app, name="journal-sink")
app.command("replay")(replay)
app.command("inspect")(inspect_command)

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
    SpendConfig,
)


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
@with_component_flags(*_COMPONENTS)
def launch(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 30000,
    worker_urls: Annotated[
        list[str] | None,
        typer.Option(help="Worker URLs; the scheme picks the kind: http(s):// (relay), grpc://, ipc:// (ZMQ)."),
    ] = None,
    prefill: Annotated[
        list[str] | None,
        typer.Option(help="With --pd-disaggregation: a prefill worker, URL [BOOTSTRAP_PORT] (repeatable)."),
    ] = None,
    decode: Annotated[
        list[str] | None, typer.Option(help="With --pd-disaggregation: a decode worker URL (repeatable).")
    ] = None,
    encode: Annotated[
        list[str] | None,
        typer.Option(help="With --epd-disaggregation: an encode worker, URL [BOOTSTRAP_PORT] (repeatable)."),
    ] = None,
    backend: Annotated[
        str | None, typer.Option("--backend", "--runtime", help="Engine runtime or API backend (e.g. sglang, vllm).")
    ] = None,
    model_path: Annotated[
        str | None, typer.Option("--model-path", "--model", help="Model path for the tokenizer (gRPC/ZMQ workers).")
    ] = None,
    tokenizer_path: Annotated[str | None, typer.Option(help="Tokenizer path, if not the model path.")] = None,
    model_alias: Annotated[
        list[str] | None, typer.Option(help="ALIAS=CANONICAL: serve CANONICAL under another name (repeatable).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Require `Authorization: Bearer <key>` from clients.", envvar="SMG_API_KEY")
    ] = None,
    cors_allowed_origins: Annotated[
        list[str] | None, typer.Option(help="Origins allowed cross-origin (default: any).")
    ] = None,
    request_timeout_secs: Annotated[
        float, typer.Option(help="Each request's deadline, every attempt included (504 timeout_error past it).")
    ] = 1800.0,
    header_read_timeout_secs: Annotated[
        float,
        typer.Option(
            help="A request's head and body must arrive whole within this, from accept (a kept-alive "
            "connection's next request: from its first byte; it waits no longer than this for it)."
        ),
    ] = 30.0,
    max_connections: Annotated[
        int | None,
        typer.Option(help="Open client connections at most; more are answered 503 (default: from the fd limit)."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    journal: Annotated[Path, typer.Option("--journal", help="SQLite journal file.", envvar="SMG_JOURNAL")] = Path(
        "smg-journal.db"
    ),
    no_journal: Annotated[bool, typer.Option("--no-journal", help="Record nothing.")] = False,
    journal_retention: Annotated[
        str | None,
        typer.Option(help="Prune the journal to an age and/or size, checked every minute: 7d, 500MB, 7d,2GB."),
    ] = None,
    journal_bodies: Annotated[
        str, typer.Option(help="What the journal keeps of content: full, redacted (fingerprints) or none.")
    ] = "full",
    max_payload_size: Annotated[int, typer.Option(help="Largest request body, in bytes.")] = 536_870_912,
    upstream_transport: Annotated[
        str, typer.Option(help="Upstream HTTP client transport: aiohttp (faster, see make bench) or httpx.")
    ] = "aiohttp",
    mcp_config_path: Annotated[
        Path | None,
        typer.Option(help="MCP tool loop policy file, YAML or JSON (see smg.mcp.config); --backend anthropic."),
    ] = None,
    chat_template: Annotated[
        Path | None, typer.Option(help="Jinja chat template file overriding the tokenizer's (gRPC workers).")
    ] = None,
    tool_call_parser: Annotated[
        str | None, typer.Option(help="gRPC workers: the model's tool-call format (default: from the model id).")
    ] = None,
    reasoning_parser: Annotated[
        str | None, typer.Option(help="gRPC workers: the model's reasoning format (default: from the model id).")
    ] = None,
    disable_tokenizer_autoload: Annotated[
        bool,
        typer.Option(
            "--disable-tokenizer-autoload",
            help="Never fetch a tokenizer from a gRPC worker: only --model-path, --tokenizer-path or "
            "POST /v1/tokenizers register one.",
        ),
    ] = False,
    zmq_engine_count: Annotated[
        int, typer.Option(help="ipc:// (ZMQ) workers: the data-parallel engines that dial each worker.")
    ] = 1,
    workers: Annotated[
        int,
        typer.Option(help="Gateway processes sharing the listening socket and the journal file (default: 1)."),
    ] = 1,
    **flags: Any,
) -> None:
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
    logs.configure(log_level if log_level.lower() in _LOG_LEVELS else "info", observability.log_json)
    # The upstream client would log every request at INFO: far too much on the hot path.
    for noisy in ("httpx", "httpcore", "httpx2", "mcp"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        try:
            router = router_config(flags)
            from smg.admission.tenants import load_tenant_secret

            admission = build_admission(
                api_key or None,
                tenant_secret=load_tenant_secret(None if no_journal else journal) if api_key else None,
                tenants=build_component(TenantConfig, flags),
                concurrency=build_component(ConcurrencyConfig, flags),
                rate_limit=build_component(RateLimitConfig, flags),
                shared=build_component(SharedStateConfig, flags),
            )
            journal_buffer = build_component(JournalBufferConfig, flags)
            prices = build_component(SpendConfig, flags).load()
            observability.check()
            fetch = build_component(FetchConfig, flags)
            fetch.policy()
            media = build_component(MediaConfig, flags)
            media.check()
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        config = build_config(
            host=host,
            port=port,
            worker_urls=worker_urls or [],
            prefill=prefill or [],
            decode=decode or [],
            encode=encode or [],
            backend=backend,
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            model_aliases=model_alias or [],
            api_key=api_key,
            cors_allowed_origins=cors_allowed_origins or [],
            request_timeout_secs=request_timeout_secs,
            header_read_timeout_secs=header_read_timeout_secs,
            max_connections=max_connections,
            log_level=log_level,
            journal_path=None if no_journal else journal,
            journal_retention=journal_retention,
            journal_bodies=journal_bodies,
            max_payload_size=max_payload_size,
            router=router,
            upstream_transport=upstream_transport,
            mcp_config_path=mcp_config_path,
            chat_template=chat_template,
            tokenizer_autoload=not disable_tokenizer_autoload,
            engine=build_component(EngineConfig, flags),
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            observability=observability,
            zmq_engine_count=zmq_engine_count,
            fetch=fetch,
            media=media,
            journal_buffer=journal_buffer,
            prices=prices,
        )
        if workers < 1:
            raise LaunchError("--workers must be at least 1")
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
        run(config, admission, workers=workers)
    except LaunchError as exc:
        typer.echo(f"smg launch: {exc}", err=True)
        raise typer.Exit(2) from None
