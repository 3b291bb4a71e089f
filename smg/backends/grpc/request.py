"""From a validated Messages request and its rendered prompt to an engine call.

Owns the per-engine rules of the spec: which stop sequences the engine matches itself and
which only the gateway matches (SGLang gets single-token stops as ids, never strings), the
sampling values (the request's, else the worker's defaults, else the engine's neutral
ones), the data-parallel rank of a rank-pinned worker, the MLX refusals, and what the gRPC
path cannot serve (`output_format`; images, but on the engines whose protocol carries them and
on an EPD deployment). `engine_call` is one attempt's call for a prepared generation
(`smg.pipeline.prepare`).
"""

from __future__ import annotations

from typing import Any

from smg.backends.grpc.types import GenerateCall
from smg.pipeline.constraints import Constraint
from smg.pipeline.prepare import Prepared
from smg.pipeline.render import Prompt
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


# The engines whose protos carry images: SGLang's and vLLM's preprocessed `mm_inputs` batch,
# TokenSpeed's `mm_inputs` items (each with its pixels as the encoder input), TRT-LLM's raw
# `image_data` (its own input processor encodes them; the prompt's placeholders are expanded by
# the gateway all the same, as the reference gateway sends them).
IMAGE_RUNTIMES = frozenset({"sglang", "vllm", "tokenspeed", "trtllm"})
# Of those, the engines that take each image's own bytes.
RAW_IMAGE_RUNTIMES = frozenset({"trtllm"})


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
            "Image inputs are not supported on these workers for this model by this gateway (SGLang, vLLM, "
            "TokenSpeed and TRT-LLM gRPC workers, vLLM ZMQ workers for the families the README lists, and EPD "
            "deployments take them; count_tokens counts them as the template's placeholder)",
            code="multimodal_not_supported",
        )


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


def engine_call(
    prepared: Prepared, *, runtime: str, defaults: dict[str, float], request_id: str, dp_rank: int | None = None
) -> GenerateCall:
    """One attempt's engine call for a prepared generation, on an engine of `runtime` with its
    worker's sampling defaults (`dp_rank`: the chosen worker's data-parallel rank). Raises
    `ApiError` for what the runtime cannot serve."""
    plan = prepared.plan
    if plan.constraint is not None and runtime == "mlx":
        raise ApiError(
            400,
            "Invalid request parameters: MLX backend does not support structured output constraint: "
            f"{plan.constraint[0]}",
            code="invalid_request_parameters",
        )
    call = generate_call(
        prepared.request,
        prepared.prompt,
        request_id=request_id,
        runtime=runtime,
        stop_ids=prepared.stop_ids,
        defaults=defaults,
        stream=prepared.stream,
        constraint=plan.constraint,
        dp_rank=dp_rank,
    )
    call.images = list(prepared.images)
    if runtime in RAW_IMAGE_RUNTIMES:
        call.image_data = list(prepared.image_data)
    call.merge_chunks = not prepared.settings.stop_sequences
    # An engine without a tokenizer (ZMQ) is told where to stop.
    call.eos_token_ids = list(prepared.tokenizer.eos_token_ids)
    return call
