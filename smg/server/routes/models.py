"""`GET /v1/models` and `GET /v1/models/{id}`: serving routes, opened by any gateway key."""

from __future__ import annotations

from typing import Any

from sanic import Sanic
from sanic.response import HTTPResponse

from smg.protocol.errors import ApiError
from smg.server.errors import api_error
from smg.server.models import list_models, retrieve_model
from smg.server.routes.guards import refused


async def _models(request: Any) -> HTTPResponse:
    denied = refused(request)
    if denied is not None:
        return denied
    try:
        return await list_models(request.app.ctx.gateway, request.ctx.headers, request.query_string)
    except ApiError as err:
        return api_error(request, err)


async def _model(request: Any, model_id: str) -> HTTPResponse:
    denied = refused(request)
    if denied is not None:
        return denied
    try:
        return await retrieve_model(request.app.ctx.gateway, request.ctx.headers, model_id, request.ctx.request_id)
    except ApiError as err:
        return api_error(request, err)


def install(app: Sanic[Any, Any]) -> None:
    app.route("/v1/models", methods=["GET"], name="models", ignore_body=True)(_models)
    app.route("/v1/models/<model_id:path>", methods=["GET"], name="model", ignore_body=True)(_model)
