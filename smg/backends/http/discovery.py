"""What an HTTP worker serves and whether it is up: `GET /v1/models` and `GET /health`.

Both the OpenAI list shape (`{"object":"list","data":[{"id",…,"max_model_len"}]}`) and the
Anthropic one (`{"data":[{"type":"model","id"}],"has_more"}`) are understood. The context
window is read from the first of `context_length`, `max_context_length`, `max_model_len`,
`max_total_tokens`, `max_seq_len` that a model entry carries.
"""

from __future__ import annotations

from typing import Any

import httpx

from smg.backends.base import Discovery, Target, WorkerUnreachable

_WINDOW_KEYS = ("context_length", "max_context_length", "max_model_len", "max_total_tokens", "max_seq_len")


def parse_model_list(payload: Any) -> dict[str, int | None]:
    """Model id → context window (None when not advertised)."""
    out: dict[str, int | None] = {}
    entries = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(entries, list):
        raise ValueError("model list has no `data` array")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        window = next(
            (entry[k] for k in _WINDOW_KEYS if isinstance(entry.get(k), int) and entry[k] > 0),
            None,
        )
        out[entry["id"]] = window
    return out


def _auth(target: Target) -> dict[str, str]:
    return {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}


async def discover(target: Target, client: httpx.AsyncClient, timeout: float = 5.0) -> Discovery:
    """What the worker serves, and whether its health endpoint agrees. Raises `WorkerUnreachable`."""
    try:
        resp = await client.get(f"{target.url}/v1/models", headers=_auth(target), timeout=timeout)
        resp.raise_for_status()
        models = parse_model_list(resp.json())
    except (httpx.HTTPError, ValueError) as exc:
        raise WorkerUnreachable(repr(exc)) from None
    try:
        healthy = await check_health(target, client, timeout)
    except WorkerUnreachable:
        healthy = False
    return Discovery(models=models, healthy=healthy)


async def check_health(
    target: Target, client: httpx.AsyncClient, timeout: float = 5.0, endpoint: str = "/health"
) -> bool:
    try:
        resp = await client.get(f"{target.url}{endpoint}", headers=_auth(target), timeout=timeout)
    except httpx.HTTPError as exc:
        raise WorkerUnreachable(repr(exc)) from None
    return resp.status_code < 400
