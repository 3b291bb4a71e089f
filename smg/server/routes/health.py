"""`/health` and `/liveness` (the process answers) and `/readiness` (a worker can take a request,
every pool's connector is ready for its workers, and the journal commits)."""

from __future__ import annotations

from typing import Any

from sanic import Sanic
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from smg.server.state import Gateway


async def _health(request: Any) -> HTTPResponse:
    return json_response({"status": "ok"})


async def _liveness(request: Any) -> HTTPResponse:
    return json_response({"status": "ok"})


async def _readiness(request: Any) -> HTTPResponse:
    gateway: Gateway = request.app.ctx.gateway
    router = gateway.router
    all_workers = router.registry.all()
    healthy = sum(w.healthy for w in all_workers)
    # A journal that cannot commit does not stop serving, but it is not a healthy gateway:
    # say so, with why, so an operator sees it before the held events are dropped.
    problem = gateway.journal.problem
    reason = f"journal: {problem}" if problem is not None else router.not_ready_reason()
    if reason is None:
        return json_response({"status": "ready", "healthy_workers": healthy, "total_workers": len(all_workers)})
    return json_response({"status": "not ready", "reason": reason}, status=503)


def install(app: Sanic[Any, Any]) -> None:
    app.route("/health", methods=["GET"], name="health", ignore_body=True)(_health)
    app.route("/liveness", methods=["GET"], name="liveness", ignore_body=True)(_liveness)
    app.route("/readiness", methods=["GET"], name="readiness", ignore_body=True)(_readiness)
