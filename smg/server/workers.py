"""The worker API: `POST /workers`, `GET /workers`, `GET /workers/{id}`, `DELETE /workers/{id}`
(behind `--api-key`), in the reference gateway's shapes and status codes.

A worker added here is registered at once and discovered in the background (202, as the
reference: its answer says the addition is queued); it is health-checked and routed to like a
static one once it answers. A removed worker gets no new request; those in flight finish.
Errors are `{"error": "<text>", "code": "<CODE>"}`.
"""

from __future__ import annotations

import uuid
from typing import Any

from sanic.response import HTTPResponse
from sanic.response import json as json_response

from smg.protocol import codec
from smg.routing.registry import DuplicateWorker
from smg.routing.router import PROVIDER_MODEL_PREFIXES, WorkerRefused, WorkerSpec
from smg.routing.workers import ROLES, Role, Worker
from smg.server.state import Gateway
from smg.shared.link import SharedStateDown

_SCHEMES = ("http://", "https://", "grpc://", "ipc://")


def _error(status: int, message: str, code: str) -> HTTPResponse:
    return json_response({"error": message, "code": code}, status=status)


def _bad(message: str) -> HTTPResponse:
    return _error(400, message, "BAD_REQUEST")


def _registry_down() -> HTTPResponse:
    """`--worker-registry`: the fleet's registry is unreachable, so no replica changes it."""
    return _error(503, "The shared worker registry is unreachable; try again", "WORKER_REGISTRY_UNAVAILABLE")


def _status(worker: Worker) -> str:
    if not worker.discovered:
        return "pending"
    return "ready" if worker.available else "not_ready"


def describe(worker: Worker) -> dict[str, Any]:
    """A worker as `GET /workers` shows it."""
    models: list[dict[str, Any]] = []
    for model in sorted(worker.models):
        card: dict[str, Any] = {"id": model}
        if model in worker.context_windows:
            card["context_length"] = worker.context_windows[model]
        if worker.external:
            card["provider"] = worker.runtime
        models.append(card)
    out: dict[str, Any] = {
        "id": worker.id,
        "model_id": models[0]["id"] if models else None,
        "url": worker.key,
        "models": models,
        "worker_type": worker.role,
        "connection_mode": worker.connection,
        "runtime_type": "external" if worker.external else (worker.runtime or "unspecified"),
        "is_healthy": worker.healthy,
        "status": _status(worker),
        "load": worker.load,
        "circuit_breaker": worker.breaker.state,
    }
    if worker.external:
        out["provider"] = worker.runtime
    if worker.dp_rank is not None:
        out["dp_rank"], out["dp_size"] = worker.dp_rank, worker.dp_size
    if worker.bootstrap_port is not None:
        out["bootstrap_port"] = worker.bootstrap_port
    if worker.last_error and not worker.healthy:
        out["last_error"] = worker.last_error
    return out


def _spec(body: Any) -> WorkerSpec | str:
    """The worker the body asks for, or why it cannot be one."""
    if not isinstance(body, dict):
        return "Invalid JSON data: expected an object"
    url = body.get("url")
    if url is None:
        return "Invalid JSON data: missing field `url`"
    if not isinstance(url, str):
        return f"Invalid JSON data: url: invalid type: expected a string, got {type(url).__name__}"
    if not url.startswith(_SCHEMES):
        return (
            f"Invalid value for field 'worker_url': {url} - URL must start with a lowercase http://, https://, "
            "grpc://, or ipc:// scheme"
        )
    role = body.get("worker_type", "regular")
    if role not in ROLES:
        return f"Invalid JSON data: worker_type: unknown variant `{role}`, expected one of {', '.join(ROLES)}"
    runtime = body.get("runtime_type", body.get("runtime"))
    provider = body.get("provider")
    api_key = body.get("api_key")
    port = body.get("bootstrap_port")
    for name, value in (("runtime_type", runtime), ("provider", provider), ("api_key", api_key)):
        if value is not None and not isinstance(value, str):
            return f"Invalid JSON data: {name}: invalid type: expected a string"
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        return "Invalid JSON data: bootstrap_port: expected a port number (1-65535)"
    external = runtime == "external" or (provider is not None and runtime is None)
    if external and provider not in PROVIDER_MODEL_PREFIXES:
        return f"an external worker needs a provider, one of {', '.join(PROVIDER_MODEL_PREFIXES)}"
    models = body.get("models") or []
    names = tuple(m if isinstance(m, str) else m.get("id") for m in models if isinstance(m, (str, dict)))
    typed_role: Role = role
    return WorkerSpec(
        url=url,
        external=external,
        provider=provider if external else None,
        api_key=api_key,
        runtime=None if external or runtime in (None, "unspecified") else runtime,
        role=typed_role,
        bootstrap_port=port,
        models=tuple(n for n in names if isinstance(n, str) and n) if external else (),
    )


async def add(request: Any) -> HTTPResponse:
    gateway: Gateway = request.app.ctx.gateway
    media = (request.ctx.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        return _bad("Missing Content-Type: application/json header")
    try:
        body = codec.loads(request.body or b"")
    except codec.BodyDecodeError as exc:
        return _bad(f"JSON syntax error: {exc}")
    spec = _spec(body)
    if isinstance(spec, str):
        return _bad(spec)
    try:
        worker = await gateway.router.add_worker(spec)
    except DuplicateWorker as duplicate:
        existing = gateway.router.registry.by_url(spec.url.rstrip("/"))
        wid = existing.id if existing is not None else (duplicate.worker_id or "?")
        return _error(
            409,
            f"Worker already exists at URL '{spec.url}' with ID {wid}. Remove it first (DELETE /workers/{wid}).",
            "WORKER_ALREADY_EXISTS",
        )
    except WorkerRefused as exc:
        return _error(400, str(exc), exc.code)
    except SharedStateDown:
        return _registry_down()
    location = f"/workers/{worker.id}"
    return json_response(
        {
            "status": "accepted",
            "worker_id": worker.id,
            "url": worker.url,
            "location": location,
            "message": "Worker addition queued for background processing",
        },
        status=202,
        headers={"location": location},
    )


async def list_all(request: Any) -> HTTPResponse:
    gateway: Gateway = request.app.ctx.gateway
    model = request.args.get("model")
    workers = gateway.router.registry.all()
    if model:
        workers = [w for w in workers if w.serves(model)]
    stats = {f"{role}_count": sum(w.role == role for w in workers) for role in ("prefill", "decode", "regular")}
    return json_response({"workers": [describe(w) for w in workers], "total": len(workers), "stats": stats})


def _lookup(gateway: Gateway, worker_id: str) -> Worker | HTTPResponse:
    try:
        uuid.UUID(worker_id)
    except ValueError:
        return _bad(f"Invalid worker_id '{worker_id}' (expected UUID)")
    worker = gateway.router.registry.get(worker_id)
    if worker is None:
        return _error(404, f"Worker {worker_id} not found", "WORKER_NOT_FOUND")
    return worker


async def show(request: Any, worker_id: str) -> HTTPResponse:
    found = _lookup(request.app.ctx.gateway, worker_id)
    return found if isinstance(found, HTTPResponse) else json_response(describe(found))


async def remove(request: Any, worker_id: str) -> HTTPResponse:
    gateway: Gateway = request.app.ctx.gateway
    found = _lookup(gateway, worker_id)
    if isinstance(found, HTTPResponse):
        return found
    try:
        await gateway.router.delete_worker(found.id)
    except SharedStateDown:
        return _registry_down()
    return json_response(
        {"status": "accepted", "worker_id": found.id, "message": "Worker removal queued for background processing"},
        status=202,
    )
