"""The tokenizer admin API: `POST/GET/DELETE /v1/tokenizers` (behind `--api-key`).

Registers a tokenizer under a name (a served model's canonical id makes it that model's
tokenizer), lists them, reports a registration job's status, and removes one — after which
the model answers 503 `tokenizer_load_failed` until another registers.
"""

from __future__ import annotations

from typing import Any

from sanic.response import HTTPResponse
from sanic.response import json as json_response

from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.protocol import codec


def _registry(request: Any) -> TokenizerRegistry | None:
    router = request.app.ctx.gateway.router
    # gRPC and ZMQ connectors share one registry.
    connector = router.connector("grpc") or router.connector("zmq")
    return getattr(connector, "tokenizers", None)


def _no_registry() -> HTTPResponse:
    return json_response(
        {"error": {"type": "not_found", "message": "This backend keeps no tokenizers (only gRPC and ZMQ workers do)"}},
        status=404,
    )


def _bad(message: str) -> HTTPResponse:
    return json_response({"error": {"type": "invalid_request_error", "message": message}}, status=400)


async def register(request: Any) -> HTTPResponse:
    registry = _registry(request)
    if registry is None:
        return _no_registry()
    try:
        body = codec.loads(request.body or b"")
    except codec.BodyDecodeError as exc:
        return _bad(f"JSON syntax error: {exc}")
    if not isinstance(body, dict):
        return _bad("body must be a JSON object with `name` and `source`")
    name, source, template = body.get("name"), body.get("source"), body.get("chat_template_path")
    if not isinstance(name, str) or not name or not isinstance(source, str) or not source:
        return _bad("`name` and `source` are required strings")
    if template is not None and not isinstance(template, str):
        return _bad("`chat_template_path` must be a string")
    existing = registry.lookup(name)
    if existing is not None and existing.name == name and existing.status != "failed":
        return json_response(
            {"id": existing.id, "status": "failed", "message": f"Tokenizer '{name}' already exists"}, status=409
        )
    entry, _ = registry.submit(name, source, template)
    return json_response(
        {
            "id": entry.id,
            "status": "pending",
            "message": f"Tokenizer '{name}' registration job submitted. Loading from: {source}",
        },
        status=202,
    )


async def list_all(request: Any) -> HTTPResponse:
    registry = _registry(request)
    if registry is None:
        return _no_registry()
    loaded = [e.summary() for e in registry.entries() if e.status == "completed"]
    return json_response({"tokenizers": loaded})


async def status(request: Any, key: str) -> HTTPResponse:
    registry = _registry(request)
    if registry is None:
        return _no_registry()
    entry = registry.lookup(key)
    if entry is None:
        return json_response({"error": {"type": "not_found", "message": f"No tokenizer '{key}'"}}, status=404)
    return json_response(entry.status_body())


async def remove(request: Any, key: str) -> HTTPResponse:
    registry = _registry(request)
    if registry is None:
        return _no_registry()
    entry = registry.remove(key)
    if entry is None:
        return json_response({"error": {"type": "not_found", "message": f"No tokenizer '{key}'"}}, status=404)
    return json_response({"id": entry.id, "name": entry.name, "status": "removed"})
