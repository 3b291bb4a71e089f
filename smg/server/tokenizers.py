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
from smg.routing.pools import GRPC, ZMQ


def _registry(request: Any) -> TokenizerRegistry | None:
    router = request.app.ctx.gateway.router
    # gRPC and ZMQ connectors share one registry.
    connector = router.connector(GRPC) or router.connector(ZMQ)
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
    """`GET /v1/tokenizers/{id}/status`: the reference's AddTokenizerResponse shape."""
    registry = _registry(request)
    if registry is None:
        return _no_registry()
    entry = registry.lookup(key)
    if entry is None:
        message = f"Tokenizer '{key}' not found and no pending job"
        return json_response({"error": {"message": message, "type": "not_found"}}, status=404)
    if entry.status == "completed" and entry.tokenizer is not None:
        message = f"Tokenizer '{entry.name}' is loaded and ready"
        body = {"id": entry.id, "status": "completed", "message": message, "vocab_size": entry.tokenizer.vocab_size}
        return json_response(body)
    message = entry.error or f"Tokenizer job is {entry.status}"
    return json_response({"id": entry.id, "status": entry.status, "message": message})


async def info(request: Any, key: str) -> HTTPResponse:
    """`GET /v1/tokenizers/{id}`: a loaded tokenizer's TokenizerInfo (one still loading is not
    in the reference's registry yet: 404, as there)."""
    registry = _registry(request)
    if registry is None:
        return _no_registry()
    entry = registry.lookup(key)
    if entry is None or entry.tokenizer is None or entry.status != "completed":
        return json_response(
            {"error": {"message": f"Tokenizer '{key}' not found", "type": "tokenizer_not_found"}}, status=404
        )
    return json_response(entry.summary())


async def remove(request: Any, key: str) -> HTTPResponse:
    registry = _registry(request)
    if registry is None:
        return _no_registry()
    entry = registry.remove(key)
    # The reference's RemoveTokenizerResponse, for both outcomes.
    if entry is None:
        return json_response({"success": False, "message": f"Tokenizer '{key}' not found"}, status=404)
    return json_response({"success": True, "message": f"Tokenizer '{entry.name}' removed successfully"})
