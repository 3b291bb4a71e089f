"""The Sanic application, composed: its limits, what every handler shares (`Gateway`), the
lifecycle of what it serves with (`lifecycle`), the middleware around every route
(`middleware`), the routes by concern (`routes/`) and the answers to what Sanic itself refuses
(`errors`)."""

from __future__ import annotations

from typing import Any

from sanic import Sanic

from smg.admission import Gates, build_admission
from smg.config import GatewayConfig
from smg.routing.router import Router, WorkerSpec
from smg.server import errors, lifecycle, middleware
from smg.server.cors import CorsPolicy
from smg.server.routes import admin, health, messages, models
from smg.server.state import Gateway


def build_app(
    config: GatewayConfig,
    router: Router,
    journal: Any,
    static: list[WorkerSpec],
    name: str = "smg",
    admission: Gates | None = None,
) -> Sanic[Any, Any]:
    # configure_logging=False: the CLI configures logging once; Sanic would print every line twice.
    app: Sanic[Any, Any] = Sanic(name, configure_logging=False)
    app.config.REQUEST_MAX_SIZE = config.max_payload_size
    app.config.RESPONSE_TIMEOUT = int(config.request_timeout_secs) + 60
    # Sanic's own request timeout restarts on every byte; the total deadline is the protocol's
    # (smg.server.connections). This one only sets how often the timeouts are checked.
    app.config.REQUEST_TIMEOUT = min(60.0, config.header_read_timeout_secs)
    # A kept-alive connection waits for its next request no longer than a request may take to
    # arrive: idle connections must not hold the connection cap (smg.server.connections).
    app.config.KEEP_ALIVE_TIMEOUT = min(75.0, config.header_read_timeout_secs)
    app.config.FALLBACK_ERROR_FORMAT = "json"
    app.config.NOISY_EXCEPTIONS = False
    admission = admission or build_admission(config.api_key)
    app.ctx.gateway = Gateway(
        config=config,
        router=router,
        journal=journal,
        cors=CorsPolicy(config.cors_allowed_origins),
        admission=admission,
    )
    lifecycle.install(app, config, router, journal, static, admission)
    middleware.install(app)
    for routes in (messages, models, admin, health):
        routes.install(app)
    errors.install(app)
    return app
