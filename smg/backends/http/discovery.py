"""What an HTTP worker serves and whether it is up: `GET /v1/models` and `GET /health`.

Both the OpenAI list shape (`{"object":"list","data":[{"id",…,"max_model_len"}]}`) and the
Anthropic one (`{"data":[{"type":"model","id"}],"has_more"}`) are understood. The context
window is read from the first of `context_length`, `max_context_length`, `max_model_len`,
`max_total_tokens`, `max_seq_len` that a model entry carries.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from smg.routing.workers import Worker

log = logging.getLogger("smg.discovery")

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


async def discover(worker: Worker, client: httpx.AsyncClient, timeout: float = 5.0) -> bool:
    """Fill in the worker's models; True when it answered."""
    try:
        resp = await client.get(f"{worker.url}/v1/models", timeout=timeout)
        resp.raise_for_status()
        models = parse_model_list(resp.json())
    except (httpx.HTTPError, ValueError) as exc:
        error = f"model discovery failed: {exc!r}"
        if error != worker.last_error:  # said once per new failure, not at every probe
            log.warning("worker %s: %s (retrying every 2 s)", worker.url, error)
        worker.last_error = error
        return False
    worker.models = set(models)
    worker.context_windows = {m: w for m, w in models.items() if w}
    worker.discovered = True
    worker.healthy = True
    worker.last_error = None
    log.info("worker %s serves %s", worker.url, ", ".join(sorted(models)) or "no models")
    return True


async def check_health(worker: Worker, client: httpx.AsyncClient, timeout: float = 5.0) -> bool:
    try:
        resp = await client.get(f"{worker.url}/health", timeout=timeout)
    except httpx.HTTPError as exc:
        return worker.record_health(False, f"health check failed: {exc!r}")
    return worker.record_health(resp.status_code < 400, f"health check answered {resp.status_code}")
