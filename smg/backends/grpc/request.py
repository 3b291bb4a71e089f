"""From a validated Messages request and its rendered prompt to an engine call.

Owns the per-engine rules of the spec: which stop sequences the engine matches itself and
which only the gateway matches (SGLang gets single-token stops as ids, never strings), the
sampling values (the request's, else the worker's defaults, else the engine's neutral
ones), the data-parallel rank of a rank-pinned worker, the MLX refusals, and what the gRPC
path cannot serve (`output_format`; images, but on an EPD deployment).
"""

from __future__ import annotations

import re
from typing import Any

from smg.backends.grpc.types import EngineError, GenerateCall
from smg.pipeline.constraints import Constraint
from smg.pipeline.render import Prompt
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.protocol.errors import ApiError

# Engines that take stop strings and match them themselves (the gateway still trims).
_STRING_STOP_RUNTIMES = frozenset({"vllm", "trtllm", "tokenspeed"})
_SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(raw: dict[str, Any]) -> dict[str, float]:
    """The worker's `default_sampling_params` reduced to what a Messages request may inherit."""
    out: dict[str, float] = {}
    for key in _SAMPLING_DEFAULT_KEYS:
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def _has_images(request: Any) -> bool:
    for message in request.messages:
        content = message.content
        if isinstance(content, str):
            continue
        for block in content:
            if getattr(block, "type", None) == "image":
                return True
            if getattr(block, "type", None) == "tool_result" and isinstance(block.content, list):
                if any(getattr(b, "type", None) == "image" for b in block.content):
                    return True
    return False


def check_servable(request: Any, runtime: str, *, generating: bool, images: bool = False) -> None:
    """Refuse what the gRPC path cannot serve, before any worker is chosen (`images`: the
    deployment serves image inputs, as an EPD one does)."""
    extra = request.model_extra or {}
    output_config = extra.get("output_config")
    if extra.get("output_format") is not None or (
        isinstance(output_config, dict) and output_config.get("format") is not None
    ):
        raise ApiError(
            400,
            "Structured output formats (output_format, output_config.format) are not supported on gRPC workers",
            code="unsupported_response_format",
        )
    if not generating:
        return
    if runtime == "mlx":
        if _has_images(request):
            raise ApiError(400, "backend mlx does not support image inputs", code="multimodal_not_supported")
        if request.stop_sequences:
            raise ApiError(
                400,
                "Invalid request parameters: MLX backend does not support string stop sequences",
                code="invalid_request_parameters",
            )
    elif not images and _has_images(request):
        raise ApiError(
            400,
            "Image inputs are not supported on gRPC workers by this gateway outside an EPD deployment "
            "(count_tokens counts them as the template's placeholder)",
            code="multimodal_not_supported",
        )


def stop_token_map(tokenizer: Tokenizer, stops: list[str]) -> dict[int, str]:
    """Each stop sequence that encodes to exactly one token, by that token id."""
    out: dict[int, str] = {}
    for stop in stops:
        token = tokenizer.token_id(stop)
        if token is not None:
            out.setdefault(token, stop)
    return out


def generate_call(
    request: Any,
    prompt: Prompt,
    *,
    request_id: str,
    runtime: str,
    stop_ids: dict[int, str],
    defaults: dict[str, float],
    stream: bool,
    constraint: Constraint | None = None,
    dp_rank: int | None = None,
) -> GenerateCall:
    """The engine call for one attempt (`dp_rank`: the rank the chosen worker is pinned to)."""
    stops = list(request.stop_sequences or [])

    def pick(name: str) -> float | None:
        value = getattr(request, name, None)
        return float(value) if value is not None else defaults.get(name)

    top_k = request.top_k if request.top_k is not None else defaults.get("top_k")
    return GenerateCall(
        request_id=request_id,
        input_ids=prompt.ids,
        text=prompt.text,
        max_tokens=request.max_tokens,
        temperature=pick("temperature"),
        top_p=pick("top_p"),
        top_k=int(top_k) if top_k is not None else None,
        min_p=defaults.get("min_p"),
        repetition_penalty=defaults.get("repetition_penalty"),
        stop=stops if runtime in _STRING_STOP_RUNTIMES else [],
        stop_token_ids=[] if runtime in _STRING_STOP_RUNTIMES else sorted(stop_ids),
        stream=stream,
        constraint=constraint,
        require_reasoning=prompt.thinking is True,
        dp_rank=dp_rank,
    )


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
