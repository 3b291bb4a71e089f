"""vLLM EngineCore's ZMQ messages, as msgpack frames: the handshake, ADD and ABORT, the outputs.

Every message is msgpack. The handshake's are maps (HELLO/READY from the engine, the INIT the
gateway answers with). `EngineCoreRequest` and `EngineCoreOutputs` are msgspec `array_like`
structs: positional arrays whose field order is the contract, and whose trailing default
fields may be left off (`omit_defaults`), so a reader pads short arrays and ignores extra
trailing fields a newer engine appends. Sampling parameters are a map whose absent keys take
vLLM's defaults. Field lists: vLLM 0.32 `vllm/v1/engine/__init__.py`, as the reference
gateway's `engine_zmq_client` reads them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

ADD = b"\x00"
ABORT = b"\x01"
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
# EngineCoreOutput.finish_reason (vLLM's FinishReason IntEnum), as the gateway names them.
FINISH_REASONS = {0: "stop", 1: "length", 2: "abort", 3: "error", 4: "stop"}


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def unpack(data: bytes) -> Any:
    # Sets (finished_requests) arrive as arrays; logprob tensors as ext types, kept opaque.
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# -- the handshake -------------------------------------------------------------------------------


def init_message(inputs: str, outputs: str) -> bytes:
    """The gateway's answer to HELLO: where the engine connects its data plane."""
    return pack(
        {
            "addresses": {
                "inputs": [inputs],
                "outputs": [outputs],
                "coordinator_input": None,
                "coordinator_output": None,
                "frontend_stats_publish_address": None,
            },
            "parallel_config": {},
        }
    )


def handshake_status(payload: bytes) -> str:
    """`HELLO` or `READY` (anything else: the empty string)."""
    try:
        message = unpack(payload)
    except (ValueError, msgpack.UnpackException):
        return ""
    status = message.get("status") if isinstance(message, dict) else None
    return status if isinstance(status, str) else ""


@dataclass(frozen=True)
class ReadyResponse:
    """What the engine's first frame on the input socket says of it (`EngineCoreReadyResponse`)."""

    max_model_len: int
    block_size: int = 0
    dtype: str = ""
    vllm_version: str = ""
    max_num_seqs: int = 0
    raw: dict[str, Any] = field(default_factory=dict)


def ready_response(payload: bytes) -> ReadyResponse:
    """Raises ValueError when the frame is not a ready response."""
    try:
        message = unpack(payload)
    except msgpack.UnpackException as exc:
        raise ValueError(f"undecodable ready response: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("max_model_len"), int):
        raise ValueError("the engine's ready response has no max_model_len")
    return ReadyResponse(
        max_model_len=int(message["max_model_len"]),
        block_size=int(message.get("block_size") or message.get("prefix_granularity") or 0),
        dtype=str(message.get("dtype") or ""),
        vllm_version=str(message.get("vllm_version") or ""),
        max_num_seqs=int(message.get("max_num_seqs") or 0),
        raw=message,
    )


# -- requests ------------------------------------------------------------------------------------


# The structured-output backend named in every constrained request. EngineCore builds the one
# backend the first such request names and raises on a request that names none ("Unsupported
# structured output backend: None"), so the frontend must name it: vLLM's own frontend, with its
# default `--structured-outputs-config.backend auto`, resolves it to xgrammar and marks it as
# chosen automatically. A schema xgrammar cannot compile fails that one request (finish ERROR).
STRUCTURED_OUTPUT_BACKEND = "xgrammar"
# The gateway's constraint kinds, as `StructuredOutputsParams` names them.
_CONSTRAINT_FIELDS = {"json_schema": "json", "regex": "regex", "ebnf": "grammar", "structural_tag": "structural_tag"}


def structured_outputs(kind: str, value: str) -> dict[str, Any]:
    """`StructuredOutputsParams` as vLLM's frontend hands it to EngineCore: the one constraint,
    the backend it resolved (`_backend`) and that it was resolved automatically."""
    key = _CONSTRAINT_FIELDS.get(kind)
    if key is None:
        raise ValueError(f"vLLM takes no {kind!r} constraint")
    constraint: Any = value
    if key == "json":
        try:
            constraint = json.loads(value)
        except ValueError:
            pass  # vLLM takes the schema as text too, and says what is wrong with it
    return {key: constraint, "_backend": STRUCTURED_OUTPUT_BACKEND, "_backend_was_auto": True}


def sampling_params(
    *,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    min_p: float | None,
    repetition_penalty: float | None,
    stop_token_ids: list[int],
    eos_token_ids: list[int],
    structured: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The sampling map. EngineCore has no tokenizer: the primary EOS goes in `_eos_token_id`,
    the other EOS ids join the stop ids, and the union is `_all_stop_token_ids`."""
    primary = eos_token_ids[0] if eos_token_ids else None
    stops = list(dict.fromkeys([*stop_token_ids, *eos_token_ids[1:]]))
    params: dict[str, Any] = {
        "temperature": 1.0 if temperature is None else float(temperature),
        "top_p": 1.0 if top_p is None else float(top_p),
        "top_k": max(top_k, 0) if top_k is not None else 0,
        "max_tokens": int(max_tokens),
        "stop_token_ids": stops,
        "_all_stop_token_ids": sorted(set(stops) | ({primary} if primary is not None else set())),
    }
    if primary is not None:
        params["_eos_token_id"] = primary
    if min_p:
        params["min_p"] = float(min_p)
    if repetition_penalty is not None and repetition_penalty != 1.0:
        params["repetition_penalty"] = float(repetition_penalty)
    if structured is not None:
        params["structured_outputs"] = structured
    return params


def add_request(
    request_id: str, prompt_token_ids: list[int], params: dict[str, Any], mm_features: list[Any] | None = None
) -> bytes:
    """`EngineCoreRequest`'s nine required fields: request_id, prompt_token_ids, mm_features
    (`smg.backends.zmq.features`), sampling_params, pooling_params, arrival_time, lora_request,
    cache_salt, data_parallel_rank (the defaulted ones after them are left off)."""
    return pack([request_id, prompt_token_ids, mm_features, params, None, time.time(), None, None, None])


def abort_request(request_ids: list[str]) -> bytes:
    return pack(list(request_ids))


# -- outputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One request's part of an engine step: new token ids, and how it ended when it did."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_tokens: int | None = None  # TokenSpeed's counts (vLLM's outputs carry none)
    completion_tokens: int | None = None


@dataclass(frozen=True)
class Outputs:
    """One `EngineCoreOutputs` frame."""

    engine_index: int
    outputs: list[Output]
    scheduler_stats: dict[str, Any] | None = None
    finished_requests: list[str] = field(default_factory=list)


def _field(values: list[Any], index: int) -> Any:
    return values[index] if index < len(values) else None


def outputs(payload: bytes) -> Outputs:
    """Raises ValueError on a frame that is not an `EngineCoreOutputs` array."""
    try:
        message = unpack(payload)
    except msgpack.UnpackException as exc:
        raise ValueError(f"undecodable engine output: {exc}") from None
    if not isinstance(message, list):
        raise ValueError(f"an engine output is an array, got {type(message).__name__}")
    parsed: list[Output] = []
    for item in _field(message, 1) or []:
        if not isinstance(item, list) or not item or not isinstance(item[0], str):
            raise ValueError("an EngineCoreOutput is an array starting with its request id")
        reason = _field(item, 5)
        stop = _field(item, 6)
        parsed.append(
            Output(
                request_id=item[0],
                new_token_ids=[int(t) for t in _field(item, 1) or []],
                finish_reason=FINISH_REASONS.get(reason, "stop") if isinstance(reason, int) else None,
                stop_reason=stop if isinstance(stop, int | str) else None,
            )
        )
    stats = _field(message, 2)
    finished = _field(message, 5)
    return Outputs(
        engine_index=int(_field(message, 0) or 0),
        outputs=parsed,
        scheduler_stats=stats if isinstance(stats, dict) else None,
        finished_requests=[r for r in finished or [] if isinstance(r, str)],
    )
