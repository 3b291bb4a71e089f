"""An SGLang `GenerateRequest` as the body of a llama.cpp completion, and what the engine refuses.

The prompt goes in as token ids, so llama.cpp neither tokenizes nor adds BOS. SGLang's neutral
values map onto llama.cpp's (top_k -1 → 0, both "off"), and every sampler llama.cpp would
otherwise apply with its own defaults (min_p 0.05, top_k 40, …) is set explicitly, so a request
samples as an SGLang engine would. `logprobs: 1` makes each streamed chunk carry its token ids.
Stop token ids and stop strings are matched by the engine itself (`server.Run`), not by llama.cpp,
which knows neither the first nor which string ended the text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import grpc


class Refusal(Exception):
    """A request the engine does not run, answered with a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Plan:
    """What one generation asks of llama.cpp and of the engine around it."""

    body: dict[str, Any]
    max_new_tokens: int | None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


def _invalid(message: str) -> Refusal:
    return Refusal(grpc.StatusCode.INVALID_ARGUMENT, message)


def _schema(text: str) -> Any:
    """The `json_schema` constraint, parsed and checked: llama.cpp's grammar compiler logs a bad
    schema and then samples unconstrained, so a bad one is refused before it gets there."""
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise _invalid(f"json_schema is not valid JSON: {exc}") from None
    try:
        from jsonschema import Draft202012Validator, SchemaError
    except ImportError:
        return schema
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise _invalid(f"json_schema is not a valid JSON schema: {exc.message}") from None
    return schema


def plan(request: Any, *, vocab_size: int, context_length: int) -> Plan:
    """The llama.cpp body for an SGLang `GenerateRequest`, or a `Refusal`."""
    ids = [int(t) for t in request.tokenized.input_ids]
    if not ids:
        raise _invalid("The decoder prompt cannot be empty")
    if len(ids) >= context_length:
        raise _invalid(
            f"The input ({len(ids)} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    if any(t < 0 or t >= vocab_size for t in ids):
        raise _invalid(f"input_ids holds a token id outside the vocabulary (0..{vocab_size - 1})")
    if request.HasField("mm_inputs") or len(request.input_embeds) or request.lora_id:
        raise Refusal(grpc.StatusCode.UNIMPLEMENTED, "multimodal inputs, input embeddings and LoRA are not served")
    if request.return_logprob or request.return_hidden_states:
        raise Refusal(grpc.StatusCode.UNIMPLEMENTED, "logprobs and hidden states are not returned by this engine")
    params = request.sampling_params
    if params.n > 1:
        raise Refusal(grpc.StatusCode.UNIMPLEMENTED, "n > 1 is not served: send one request per sample")
    if params.min_new_tokens > 0:
        raise Refusal(grpc.StatusCode.UNIMPLEMENTED, "min_new_tokens is not served by llama.cpp")
    max_new = params.max_new_tokens if params.HasField("max_new_tokens") else None
    if max_new is not None and max_new < 0:
        raise _invalid("max_new_tokens must not be negative")

    body: dict[str, Any] = {
        "prompt": ids,
        "stream": True,
        "logprobs": 1,
        "cache_prompt": True,
        "n_predict": max_new if max_new is not None else -1,
        "temperature": max(0.0, params.temperature),
        "top_p": params.top_p if 0.0 < params.top_p <= 1.0 else 1.0,
        "top_k": params.top_k if params.top_k > 0 else 0,
        "min_p": max(0.0, params.min_p),
        "repeat_penalty": params.repetition_penalty if params.repetition_penalty > 0 else 1.0,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
        "typical_p": 1.0,
        "xtc_probability": 0.0,
        "dry_multiplier": 0.0,
        "mirostat": 0,
        "ignore_eos": params.ignore_eos,
    }
    if params.logit_bias:
        try:
            body["logit_bias"] = [[int(token), float(bias)] for token, bias in params.logit_bias.items()]
        except ValueError:
            raise _invalid("logit_bias keys must be token ids") from None
    constraint = params.WhichOneof("constraint")
    if constraint == "json_schema":
        body["json_schema"] = _schema(params.json_schema)
    elif constraint == "ebnf_grammar":
        body["grammar"] = params.ebnf_grammar  # GBNF: llama.cpp's dialect of EBNF
    elif constraint is not None:
        raise Refusal(grpc.StatusCode.UNIMPLEMENTED, f"the {constraint} constraint is not served by llama.cpp")
    return Plan(
        body=body,
        max_new_tokens=max_new,
        stop_token_ids=frozenset(int(t) for t in params.stop_token_ids),
        stop=tuple(s for s in params.stop if s),
        ignore_eos=params.ignore_eos,
    )
