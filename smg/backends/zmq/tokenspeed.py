"""TokenSpeed's native engine messages over the same ZMQ transport as vLLM's EngineCore.

TokenSpeed's data-plane messages are tagged msgspec `array_like` structs: positional arrays
whose element 0 is the class name. The request is `TokenizedGenerateReqInput` (11 elements,
its `SamplingParams` a nested untagged 29-element array sent already normalized, so the engine
skips re-deriving it); ABORT is a plain list of ids, as for vLLM. Outputs are
`BatchTokenIDOutSlim`: parallel columns (ids, new output ids, finish reason — "" while running
—, prompt/completion/cached counts, logprobs), then the engine index and load counts that newer
engines append. TokenSpeed knows its model's EOS itself; it cannot match stop strings, which the
gateway does. Field lists: the reference gateway's `engine_zmq_client/src/protocol/tokenspeed`.
"""

from __future__ import annotations

from typing import Any

from smg.backends.zmq import wire

REQUEST_TAG = "TokenizedGenerateReqInput"
OUTPUT_TAG = "BatchTokenIDOutSlim"
TOP_K_DISABLED = 1 << 30
_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


def sampling_params(
    *,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    min_p: float | None,
    repetition_penalty: float | None,
    stop_token_ids: list[int],
    constraint: tuple[str, str] | None,
) -> list[Any]:
    """The normalized 29-element `SamplingParams` array."""
    temp = 1.0 if temperature is None else float(temperature)
    k = top_k if top_k is not None and top_k > 0 else TOP_K_DISABLED
    if temp < 1e-6:  # greedy, as TokenSpeed's own normalize() spells it
        temp, k = 1.0, 1
    kind, value = constraint if constraint is not None else ("", "")
    return [
        int(max_tokens),  # max_new_tokens
        None,  # stop
        list(stop_token_ids) or None,
        temp,
        1.0 if top_p is None else float(top_p),
        k,
        float(min_p or 0.0),
        0.0,  # frequency_penalty
        0.0,  # presence_penalty
        1.0 if repetition_penalty is None else float(repetition_penalty),
        0,  # min_new_tokens
        value if kind == "json_schema" else None,
        value if kind == "regex" else None,
        value if kind == "ebnf" else None,
        value if kind == "structural_tag" else None,
        False,  # ignore_eos
        True,  # skip_special_tokens
        True,  # spaces_between_special_tokens
        False,  # no_stop_trim
        None,  # thinking_budget
        None,  # custom_params
        None,  # stream_interval
        None,  # logit_bias
        None,  # seed
        None,  # logprobs
        1,  # n
        [],  # stop_strs
        0,  # stop_str_max_len
        True,  # is_normalized
    ]


def add_request(request_id: str, input_ids: list[int], params: list[Any], *, stream: bool = True) -> bytes:
    return wire.pack([REQUEST_TAG, request_id, None, None, list(input_ids), params, False, -1, 0, None, stream])


def outputs(payload: bytes) -> wire.Outputs:
    """Raises ValueError on a frame that is not a `BatchTokenIDOutSlim` with even columns."""
    try:
        message = wire.unpack(payload)
    except ValueError as exc:
        raise ValueError(f"undecodable TokenSpeed output: {exc}") from None
    if not isinstance(message, list) or not message or message[0] != OUTPUT_TAG or len(message) < 9:
        raise ValueError(f"not a {OUTPUT_TAG} array")
    rids, ids, reasons, prompts, completions = message[1], message[2], message[3], message[4], message[5]
    if not all(isinstance(c, list) and len(c) == len(rids) for c in (ids, reasons, prompts, completions)):
        raise ValueError(f"ragged {OUTPUT_TAG} columns")
    parsed = [
        wire.Output(
            request_id=str(rid),
            new_token_ids=[int(t) for t in new or []],
            finish_reason=_FINISH.get(reason, "stop") if reason else None,
            prompt_tokens=int(prompt),
            completion_tokens=int(completion),
        )
        for rid, new, reason, prompt, completion in zip(rids, ids, reasons, prompts, completions, strict=True)
    ]
    extra = [int(v) if isinstance(v, int) else 0 for v in message[9:14]] + [0] * 5
    index, running, waiting, active, total = extra[:5]
    stats = (
        {"num_running_reqs": running, "num_waiting_reqs": waiting, "kv_cache_usage": active / total}
        if total > 0
        else None
    )
    return wire.Outputs(engine_index=index, outputs=parsed, scheduler_stats=stats)

