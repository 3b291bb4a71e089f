"""The admin routes, opened by the shared key only: the tokenizer API (`/v1/tokenizers`) and the
worker API (`/workers`)."""

from __future__ import annotations

from typing import Any

from sanic import Sanic
from sanic.response import HTTPResponse

from smg.server import tokenizers, workers
from smg.server.routes.guards import refused_admin


async def _tokenizers(request: Any) -> HTTPResponse:
    denied = refused_admin(request)
    if denied is not None:
        return denied
    return await (tokenizers.register(request) if request.method == "POST" else tokenizers.list_all(request))


async def _tokenizer(request: Any, key: str) -> HTTPResponse:
    denied = refused_admin(request)
    if denied is not None:
        return denied
    if request.method == "DELETE":
        return await tokenizers.remove(request, key)
    if key.endswith("/status"):
        return await tokenizers.status(request, key.removesuffix("/status"))
    return await tokenizers.info(request, key)


async def _workers(request: Any) -> HTTPResponse:
    denied = refused_admin(request)
    if denied is not None:
        return denied
    return await (workers.add(request) if request.method == "POST" else workers.list_all(request))


async def _worker(request: Any, worker_id: str) -> HTTPResponse:
    denied = refused_admin(request)
    if denied is not None:
        return denied
    if request.method == "DELETE":
        return await workers.remove(request, worker_id)
    return await workers.show(request, worker_id)


def install(app: Sanic[Any, Any]) -> None:
    app.route("/v1/tokenizers", methods=["GET", "POST"], name="tokenizers")(_tokenizers)
    app.route("/v1/tokenizers/<key:path>", methods=["GET", "DELETE"], name="tokenizer")(_tokenizer)
    app.route("/workers", methods=["GET", "POST"], name="workers")(_workers)
    app.route("/workers/<worker_id>", methods=["GET", "DELETE"], name="worker")(_worker)
