"""From command-line values to a running gateway: checks the settings, builds the router with a
connector per worker kind, the journal writer and the Sanic app, and serves."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from smg.admission import Gates
from smg.backends.http.client import TRANSPORTS
from smg.cli.options import build_component
from smg.config import GatewayConfig
from smg.routing.config import RouterConfig
from smg.routing.router import Router, WorkerRefused, WorkerSpec, gateway_itself
from smg.routing.self_address import ListeningAddress
from smg.routing.worker_urls import check_worker_url
from smg.routing.workers import ENGINE_RUNTIMES, worker_kind
from smg.shared.link import is_redis_url

log = logging.getLogger("smg.launch")

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class LaunchError(ValueError):
    """A setting that cannot work, said plainly."""


def _known_parser(flag: str, name: str | None, known: Iterable[str]) -> str | None:
    """A parser name the gateway has; an unknown one falls back to detection, as the spec says."""
    if name is None or name in known:
        return name
    log.warning("%s %r is not a known parser (%s); detecting from the model id", flag, name, ", ".join(sorted(known)))
    return None


def build_config(params: Mapping[str, Any], **components: Any) -> GatewayConfig:
    """The gateway's settings from the parsed `smg launch` flags (`params`, by option name) and
    the components built from them (`router=…`, `engine=…`), checked as a whole. Raises
    `LaunchError` (a `ValueError`)."""
    try:
        config = build_component(GatewayConfig, params, **components)
    except LaunchError:
        raise
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    return check_config(config)


def check_config(config: GatewayConfig) -> GatewayConfig:
    """`config` as the gateway serves it, once the settings are checked against each other.
    Raises `LaunchError` for settings that cannot work together."""
    router = config.router
    backend, model_path, tokenizer_path = config.backend, config.model_path, config.tokenizer_path
    chat_template = config.chat_template
    tool_call_parser, reasoning_parser = config.tool_call_parser, config.reasoning_parser
    worker_urls = list(config.worker_urls)
    prefill_urls, decode_urls, encode_urls = config.prefill_urls, config.decode_urls, config.encode_urls
    disaggregated = router.pd or router.epd
    if router.pd and router.epd:
        raise LaunchError("--pd-disaggregation and --epd-disaggregation are two modes: choose one")
    if (prefill_urls or decode_urls) and not disaggregated:
        raise LaunchError("--prefill/--decode need --pd-disaggregation (or --epd-disaggregation)")
    if encode_urls and not router.epd:
        raise LaunchError("--encode needs --epd-disaggregation")
    if router.pd and not router.igw and not (prefill_urls and decode_urls):
        raise LaunchError("--pd-disaggregation needs at least one --prefill URL and one --decode URL")
    if router.epd and not router.igw and not (encode_urls and prefill_urls and decode_urls):
        raise LaunchError("--epd-disaggregation needs at least one --encode, one --prefill and one --decode URL")
    leg_urls = [*(u for u, _ in encode_urls), *(u for u, _ in prefill_urls), *decode_urls]
    if not worker_urls and not router.igw and not disaggregated:
        raise LaunchError("--worker-urls is required (e.g. --worker-urls http://127.0.0.1:8000), unless --enable-igw")
    kinds = set()
    for url in [*worker_urls, *leg_urls]:
        try:
            kinds.add(worker_kind(url))
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
    _check_worker_urls(config.host, config.port, worker_urls, leg_urls, backend, router)
    if "zmq" in kinds:
        _check_zmq(backend, model_path, config.zmq_engine_count)
    leg_kinds = {worker_kind(u) for u in leg_urls}
    if "zmq" in leg_kinds:
        # As the reference: the ZMQ wire carries no KV-transfer metadata and has no encode path.
        raise LaunchError("prefill/decode/encode workers must be grpc:// (or http(s):// for PD): ZMQ carries no KV "
                          "transfer metadata")
    if len(leg_kinds) > 1:
        raise LaunchError("the prefill and decode workers of one deployment use one connection: all grpc:// or all "
                          "http(s)://")
    if router.epd and leg_kinds - {"grpc"}:
        raise LaunchError("--epd-disaggregation serves grpc:// workers (TokenSpeed) only")
    if router.epd and backend is not None and backend != "tokenspeed":
        raise LaunchError(f"--epd-disaggregation serves TokenSpeed workers; --backend {backend} has no encode workers")
    if len(kinds) > 1 and not router.igw:
        raise LaunchError("mixing gRPC, ZMQ and HTTP workers needs IGW mode (--enable-igw)")
    grpc = bool(kinds & {"grpc", "zmq"}) or (router.igw and not kinds)
    if "grpc" in kinds and backend is not None and backend not in ENGINE_RUNTIMES:
        runtimes = ", ".join(ENGINE_RUNTIMES)
        raise LaunchError(f"--backend {backend} cannot serve grpc:// workers; use one of {runtimes}")
    if grpc:
        for path, flag in ((tokenizer_path, "--tokenizer-path"), (model_path, "--model-path")):
            if path and not Path(path).exists():
                log.warning("%s %s is not a local directory; loading it needs the Hugging Face hub", flag, path)
        if chat_template is not None and not chat_template.exists():
            raise LaunchError(f"--chat-template {chat_template}: no such file")
        from smg.pipeline.parsers.reasoning import REASONING_PARSERS
        from smg.pipeline.parsers.tools import TOOL_PARSERS

        tool_call_parser = _known_parser("--tool-call-parser", tool_call_parser, TOOL_PARSERS)
        reasoning_parser = _known_parser("--reasoning-parser", reasoning_parser, REASONING_PARSERS)
    if not grpc and backend is not None:
        if backend in ENGINE_RUNTIMES or backend == "openai":
            pass  # the relay serves any engine that implements the Messages API over HTTP
        elif backend == "anthropic":
            pass  # the worker URLs are Anthropic API origins (e.g. https://api.anthropic.com)
        elif backend == "gemini":
            raise LaunchError(f"--backend {backend} is not supported by this gateway yet")
        else:
            raise LaunchError(f"unknown --backend {backend!r}")
    if config.mcp_config_path is not None:
        from smg.mcp import McpConfigError, load_mcp_config

        try:
            load_mcp_config(config.mcp_config_path)
        except McpConfigError as exc:
            raise LaunchError(str(exc)) from None
        if backend != "anthropic" and not router.igw:
            log.warning("--mcp-config-path is used only by the MCP tool loop of --backend anthropic")
    if (tool_call_parser or reasoning_parser) and not grpc:
        log.warning("--tool-call-parser/--reasoning-parser are used only by gRPC workers")
    if (model_path or tokenizer_path or chat_template) and not grpc:
        log.warning("--model-path/--tokenizer-path are used only by gRPC/ZMQ workers; HTTP workers tokenize themselves")
    if config.upstream_transport not in TRANSPORTS:
        raise LaunchError(f"--upstream-transport must be one of {', '.join(TRANSPORTS)}")
    if config.log_level not in _LOG_LEVELS:
        raise LaunchError(f"--log-level must be one of {', '.join(_LOG_LEVELS)}")
    if not 0 < config.port < 65536:
        raise LaunchError("--port must be between 1 and 65535")
    if config.request_timeout_secs <= 0:
        raise LaunchError("--request-timeout-secs must be positive")
    if config.header_read_timeout_secs <= 0:
        raise LaunchError("--header-read-timeout-secs must be positive")
    if config.max_connections is not None and config.max_connections < 1:
        raise LaunchError("--max-connections must be at least 1")
    if router.worker_registry is not None and not is_redis_url(router.worker_registry):
        raise LaunchError(f"--worker-registry takes a redis:// URL, got {router.worker_registry!r}")
    _check_journal_settings(config)
    return dataclasses.replace(
        config,
        router=dataclasses.replace(router, runtime=backend if backend in ENGINE_RUNTIMES else None),
        tool_call_parser=tool_call_parser if grpc else None,
        reasoning_parser=reasoning_parser if grpc else None,
    )


def _check_journal_settings(config: GatewayConfig) -> None:
    """Checks `--journal-bodies`; warns of journal settings that `--no-journal` makes moot."""
    from journal.bodies import MODES

    if config.journal_bodies not in MODES:
        raise LaunchError(f"--journal-bodies must be one of {', '.join(MODES)}")
    if config.journal_path is None and (config.journal_retention is not None or config.journal_bodies != "full"):
        log.warning("--journal-retention/--journal-bodies have no effect with --no-journal")


def _check_worker_urls(
    host: str, port: int, worker_urls: list[str], leg_urls: list[str], backend: str | None, router: RouterConfig
) -> None:
    """What the worker API refuses, refused at start too: a URL its kind does not take, and the
    gateway's own address."""
    listening = ListeningAddress(host, port)
    provider = "anthropic" if backend == "anthropic" else None
    for url, url_provider in [*((u, provider) for u in worker_urls), *((u, None) for u in leg_urls)]:
        try:
            check_worker_url(url.rstrip("/"), provider=url_provider, config=router.urls)
            if listening.leads_here(url):
                raise gateway_itself(url)
        except WorkerRefused as exc:
            raise LaunchError(str(exc)) from None


def _check_zmq(backend: str | None, model_path: str | None, engine_count: int) -> None:
    """ipc:// workers: the wire cannot be detected, and EngineCore reports no model id."""
    from smg.backends.zmq import ZMQ_RUNTIMES

    if backend is None:
        raise LaunchError("ipc:// (ZMQ) workers need --backend vllm or tokenspeed: the ZMQ wire cannot be detected")
    if backend not in ZMQ_RUNTIMES:
        raise LaunchError(f"--backend {backend} cannot serve ipc:// workers; use one of {', '.join(ZMQ_RUNTIMES)}")
    if not model_path:
        raise LaunchError("ipc:// (ZMQ) workers need --model-path: it is the model id and the tokenizer")
    if engine_count < 1:
        raise LaunchError("--zmq-engine-count must be at least 1")


def build_router(config: GatewayConfig) -> tuple[Router, list[WorkerSpec]]:
    """The router with a connector for each kind of worker the gateway may serve (all of them in
    IGW mode), and the static workers it starts with."""
    from smg.cli.connectors import build_connectors

    connectors = build_connectors(config)
    anthropic = config.backend == "anthropic"
    specs = [
        WorkerSpec(url=url, external=True, provider="anthropic", wildcard=not config.router.igw)
        if anthropic
        else WorkerSpec(url=url)
        for url in config.worker_urls
    ]
    specs += [WorkerSpec(url=url, role="prefill", bootstrap_port=port) for url, port in config.prefill_urls]
    specs += [WorkerSpec(url=url, role="decode") for url in config.decode_urls]
    specs += [WorkerSpec(url=url, role="encode", bootstrap_port=port) for url, port in config.encode_urls]
    router = Router(config.router, connectors, listening=ListeningAddress(config.host, config.port))
    if config.router.worker_registry:
        from smg.routing.shared_registry import SharedWorkers
        from smg.shared.link import link

        down = "the worker registry keeps the workers it knows and refuses changes (503) until it returns"
        router.shared = SharedWorkers(link(config.router.worker_registry, down), router)
    return router, specs


def warn_if_admin_is_open(config: GatewayConfig, admission: Gates | None) -> bool:
    """One warning when the admin routes (the worker and tokenizer APIs) take requests from the
    network without a key: anyone who can connect can then add a worker, and so read every
    request sent to it. True when it warned."""
    from smg.protocol.errors import ApiError

    try:
        if admission is not None:
            admission.keys.admin({})
        elif config.api_key:
            return False
    except ApiError:
        return False  # a key is needed
    if ListeningAddress(config.host, config.port).loopback_only:
        return False
    log.warning(
        "the admin routes (/workers, /v1/tokenizers) are open to the network without a key: anyone who can reach "
        "%s:%d can add workers and so receive requests and credentials; set --api-key, or --host 127.0.0.1",
        config.host,
        config.port,
    )
    return True


def check_journal(path: Path) -> None:
    """Open the journal for writing once before serving (creating and migrating it, taking the
    write lock a moment and registering as a live writer, `journal.recovery`), so that a
    location that cannot be written is one clear error naming the file, not a traceback out of
    the server's start. Raises `LaunchError`."""
    import sqlite3

    from journal import recovery, schema
    from smg.cli.migrating import MigrationProgress

    try:
        with MigrationProgress(str(path)) as progress:
            conn = schema.connect(path, progress=progress)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        recovery.Registration(path).close()
    except recovery.RegistrationError as exc:
        raise LaunchError(f"cannot write the journal {path}: {exc}") from None
    except (sqlite3.Error, OSError) as exc:
        raise LaunchError(f"cannot write the journal {path}: {exc} (another --journal, or --no-journal)") from None


def run(config: GatewayConfig, admission: Gates | None = None, workers: int = 1) -> None:
    """Serve until interrupted: in this process (one journal writer, one event loop), or with
    `workers` > 1 in that many processes sharing one listening socket (see `_serve_forked`)."""
    if workers < 1:
        raise LaunchError("--workers must be at least 1")
    warn_if_admin_is_open(config, admission)
    from smg.admission.startup import warn_about_tenant_names

    warn_about_tenant_names(
        config.api_key, admission, worker_registry=config.router.worker_registry, journal_sink=config.journal_sink.url
    )
    if config.journal_path:
        check_journal(config.journal_path)
        from smg.admission.tenants import load_tenant_secret

        try:  # made here, once: every process reads it to key the journal's fingerprints
            load_tenant_secret(config.journal_path)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
    if workers == 1:
        _serve(config, admission, sock=None, retention=True)
    else:
        _serve_forked(config, admission, workers)


def _serve(config: GatewayConfig, admission: Gates | None, sock: socket.socket | None, retention: bool) -> None:
    from journal.writer import JournalWriter, NullJournal
    from smg import journal_sink
    from smg.admission.tenants import load_tenant_secret
    from smg.observability import metrics
    from smg.server.app import build_app
    from smg.server.connections import default_max_connections, guarded_protocol

    router, static = build_router(config)
    journal = (
        JournalWriter(
            config.journal_path,
            bodies=config.journal_bodies,
            retention=config.journal_retention if retention else None,
            max_held=config.journal_buffer.journal_max_held,
            recover=retention,
            secret=load_tenant_secret(config.journal_path),
            prices=config.prices,
        )
        if config.journal_path
        else NullJournal()
    )
    app = build_app(config, router, journal, static, admission=admission)
    max_age_s = config.journal_retention[0] if config.journal_retention else None
    shipper = journal_sink.start(config.journal_sink, config.journal_path, config.port, max_age_s)
    if shipper is not None and metrics.current is not None:
        metrics.current.state.sink = lambda: shipper.stats
    log.info("smg listening on http://%s:%d (journal: %s)", config.host, config.port, config.journal_path or "off")
    max_connections = config.max_connections or default_max_connections()
    where: dict[str, Any] = {"sock": sock} if sock is not None else {"host": config.host, "port": config.port}
    try:
        app.run(
            **where,
            protocol=guarded_protocol(config.header_read_timeout_secs, max_connections),
            single_process=True,
            access_log=False,
            motd=False,
            debug=False,
        )
    finally:
        if shipper is not None:
            shipper.stop()


def _serve_forked(config: GatewayConfig, admission: Gates | None, workers: int) -> None:
    """`workers` gateway processes on one listening socket, bound here and inherited: the kernel
    hands each connection to one of them. Each process has its own router, engine channels and
    journal writer; all writers append to the one journal file (SQLite's write lock serializes
    their group commits, and request keys are assigned inside those transactions), so `smg
    journal`, replay and the inspector see every process's requests. Only the first process
    runs retention. The processes are forked before any of them opens a channel or a loop (gRPC
    and event loops do not survive a fork); SIGINT/SIGTERM here stop them all, and a process
    that dies takes the others down with it rather than leaving a gateway that serves less."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    sock.listen(1024)
    sock.setblocking(False)
    children: list[int] = []
    for index in range(workers):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                _serve(config, admission, sock=sock, retention=index == 0)
            except BaseException:
                log.exception("gateway process %d failed", index)
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    sock.close()
    log.info("smg: %d gateway processes (%s)", workers, ", ".join(map(str, children)))

    def stop(signum: int, _frame: Any) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    alive = set(children)
    stopping = False
    while alive:
        try:
            pid, _status = os.wait()
        except ChildProcessError:
            break
        alive.discard(pid)
        if not stopping:
            stopping = True
            stop(signal.SIGTERM, None)
