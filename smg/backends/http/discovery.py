"""What an HTTP worker serves and whether it is up: `GET /v1/models` and `GET /health`.

Both the OpenAI list shape (`{"object":"list","data":[{"id",…,"max_model_len"}]}`) and the
Anthropic one (`{"data":[{"type":"model","id"}],"has_more"}`) are understood. The context
window is read from the first of `context_length`, `max_context_length`, `max_model_len`,
`max_total_tokens`, `max_seq_len` that a model entry carries. An entry `owned_by` an engine the
gateway knows (`vllm`, `sglang`) names the worker's runtime, as the reference gateway detects it
(a vLLM prefill/decode pair is served sequentially). Under `--dp-aware` an SGLang worker's
`GET /server_info` `dp_size` says how many data-parallel ranks it has, as the reference asks it.
"""

from __future__ import annotations

from typing import Any

import httpx

from smg.backends.base import Discovery, Target, WorkerUnreachable
from smg.protocol.errors import describe_exception, reason_phrase

_RUNTIMES = ("vllm", "sglang")
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


def runtime_of(payload: Any) -> str | None:
    """The engine an OpenAI model list says serves it (`owned_by`), if one the gateway knows."""
    entries = payload.get("data") if isinstance(payload, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        owner = entry.get("owned_by") if isinstance(entry, dict) else None
        if isinstance(owner, str) and owner.lower() in _RUNTIMES:
            return owner.lower()
    return None


def probe_failure(exc: httpx.HTTPError | ValueError) -> str:
    """What a failed probe says in a worker's `last_error` and the log: the status and its
    reason, or the kind of failure, never what the worker answered (a URL may lead anywhere,
    and `GET /workers` shows it to anyone with the admin key)."""
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return f"answered HTTP {status} {reason_phrase(status)}"
    if isinstance(exc, ValueError):
        return "answered something that is not a model list"
    if isinstance(exc, (httpx.ConnectError, httpx.TimeoutException)):
        return describe_exception(exc)[:200]
    return f"{type(exc).__name__}: no readable HTTP answer"  # a parser's message may quote the bytes


def _auth(target: Target) -> dict[str, str]:
    return {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}


async def dp_size_of(target: Target, client: httpx.AsyncClient, timeout: float = 5.0) -> int | None:
    """SGLang's `/server_info` `dp_size`; None when it does not say (or does not answer)."""
    try:
        resp = await client.get(f"{target.url}/server_info", headers=_auth(target), timeout=timeout)
        resp.raise_for_status()
        value = resp.json().get("dp_size")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def discover(
    target: Target, client: httpx.AsyncClient, timeout: float = 5.0, *, dp_aware: bool = False
) -> Discovery:
    """What the worker serves, and whether its health endpoint agrees (`dp_aware`: and its
    data-parallel size, for an SGLang worker). Raises `WorkerUnreachable`."""
    try:
        resp = await client.get(f"{target.url}/v1/models", headers=_auth(target), timeout=timeout)
        resp.raise_for_status()
        payload = resp.json()
        models = parse_model_list(payload)
    except (httpx.HTTPError, ValueError) as exc:
        raise WorkerUnreachable(probe_failure(exc)) from None
    try:
        healthy = await check_health(target, client, timeout)
    except WorkerUnreachable:
        healthy = False
    runtime = runtime_of(payload) or target.runtime
    dp_size = await dp_size_of(target, client, timeout) if dp_aware and runtime == "sglang" else None
    return Discovery(models=models, healthy=healthy, runtime=runtime_of(payload), dp_size=dp_size)


async def check_health(
    target: Target, client: httpx.AsyncClient, timeout: float = 5.0, endpoint: str = "/health"
) -> bool:
    try:
        resp = await client.get(f"{target.url}{endpoint}", headers=_auth(target), timeout=timeout)
    except httpx.HTTPError as exc:
        raise WorkerUnreachable(probe_failure(exc)) from None
    return resp.status_code < 400
