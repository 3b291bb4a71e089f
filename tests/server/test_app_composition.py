"""`build_app` composes the route modules: every route the gateway serves, under its name, path
and methods, with the middleware around them and the one handler of Sanic's own refusals."""

from __future__ import annotations

from sanic.exceptions import SanicException

from journal.writer import NullJournal
from smg.cli.launch import build_router
from smg.config import GatewayConfig
from smg.server import errors, middleware
from smg.server.app import build_app

EVERY = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"}


def test_the_app_serves_each_route_from_its_module() -> None:
    config = GatewayConfig(worker_urls=("http://127.0.0.1:1",), journal_path=None)
    router, static = build_router(config)
    app = build_app(config, router, NullJournal(), static, name="smg_composed")
    routes = {
        r.name.removeprefix("smg_composed."): (r.path, set(r.methods), r.handler.__module__) for r in app.router.routes
    }
    assert routes == {
        "messages": ("v1/messages", EVERY, "smg.server.routes.messages"),
        "count_tokens": ("v1/messages/count_tokens", EVERY, "smg.server.routes.messages"),
        "messages_unknown": ("v1/messages/<rest:path>", EVERY, "smg.server.routes.messages"),
        "models": ("v1/models", {"GET"}, "smg.server.routes.models"),
        "model": ("v1/models/<model_id:path>", {"GET"}, "smg.server.routes.models"),
        "tokenizers": ("v1/tokenizers", {"GET", "POST"}, "smg.server.routes.admin"),
        "tokenizer": ("v1/tokenizers/<key:path>", {"GET", "DELETE"}, "smg.server.routes.admin"),
        "workers": ("workers", {"GET", "POST"}, "smg.server.routes.admin"),
        "worker": ("workers/<worker_id:str>", {"GET", "DELETE"}, "smg.server.routes.admin"),
        "health": ("health", {"GET"}, "smg.server.routes.health"),
        "liveness": ("liveness", {"GET"}, "smg.server.routes.health"),
        "readiness": ("readiness", {"GET"}, "smg.server.routes.health"),
    }
    assert [m.func.__module__ for m in app.request_middleware] == [middleware.__name__]
    assert [m.func.__module__ for m in app.response_middleware] == [middleware.__name__]
    assert app.error_handler.cached_handlers[SanicException, None] is errors.sanic_error
