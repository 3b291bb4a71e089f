"""What an engine answers, in engine-neutral terms, and how its failures are told to clients.

Every engine client (gRPC, ZMQ, a playback one) yields `EngineChunk`s then one `EngineDone`, or
raises `EngineError`; the generation session (`smg.pipeline.session`) reads exactly these.
`engine_failure` is the one mapping from an engine's failure to the client's error (status,
machine code, the engine's words with every worker address left out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from smg.protocol.errors import ApiError


@dataclass
class EngineChunk:
    """New output tokens. `completion_tokens` is the running total, whatever the engine sends."""

    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass
class EngineDone:
    """The end of a generation. `token_ids` are output tokens no chunk delivered (all of them
    for a non-streaming call); `completion_tokens` is the total."""

    finish_reason: str  # "stop" | "length" | "abort" | engine-specific
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int] = field(default_factory=list)
    matched_token_id: int | None = None
    matched_stop_str: str | None = None
    cached_tokens: int = 0
    kv_transfer_params: str | None = None  # vLLM: what a prefill leg returns for its decode leg


EngineEvent = EngineChunk | EngineDone


class EngineError(Exception):
    """The engine refused or failed a call. `code` is the gRPC status name (e.g. `INVALID_ARGUMENT`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def unavailable(self) -> bool:
        """Nothing answered (connection refused, engine gone): the worker is down, not the request bad."""
        return self.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")


# Where a worker is, as engines and the gRPC stack spell it: a URL, a resolver target
# (`ipv4:…`, `unix:…`), an IP address (v4, or v6 in brackets), a host with a port.
_ADDRESS = re.compile(
    r"\b[a-z][a-z0-9+.-]*://[^\s,;'\")]+"
    r"|\b(?:ipv4|ipv6|unix|unix-abstract|dns|vsock):[^\s,;'\")]+"
    r"|\[[0-9a-f:.%]+\](?::\d+)?"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"
    r"|\b[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*:\d{2,5}\b",
    re.IGNORECASE,
)


def public_detail(exc: EngineError) -> str:
    """An engine error's words as a client may read them: every worker address left out."""
    return _ADDRESS.sub("the worker", exc.message or exc.code)


def engine_failure(exc: EngineError, *, started: bool) -> ApiError:
    """An engine's refusal or failure, as the client is told it (its words, addresses left out;
    the journal's error event keeps them whole in `detail`)."""
    detail = public_detail(exc)
    full = f"{exc.code}: {exc.message}" if exc.message else exc.code
    if started:
        return ApiError(500, f"Stream error: {detail}", code="engine_stream_error", detail=full)
    if exc.code in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION"):
        return ApiError(400, f"The engine refused the request: {detail}", code="engine_rejected_request", detail=full)
    if exc.code == "RESOURCE_EXHAUSTED":
        return ApiError(503, f"The engine is overloaded: {detail}", code="engine_overloaded", detail=full)
    if exc.code == "DEADLINE_EXCEEDED":
        return ApiError(504, f"The engine did not answer in time: {detail}", code="engine_timeout", detail=full)
    if exc.unavailable:
        return ApiError(502, f"The engine is unreachable: {detail}", code="engine_unavailable", detail=full)
    return ApiError(500, f"The engine failed: {detail}", code="engine_error", detail=full)
