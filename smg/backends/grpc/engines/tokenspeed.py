"""The TokenSpeed scheduler protocol (`tokenspeed.grpc.scheduler.TokenSpeedScheduler`).

Request: SGLang-like sampling values, but every scalar is `optional` so each is set explicitly
(top_k -1 when unset), `max_new_tokens`, stop strings sent, the constraint as `regex` /
`json_schema` / `ebnf_grammar` / `structural_tag`. Stream: chunks carry new ids and running-total
counts; the streamed `complete` repeats the last chunk's ids. A matched stop token is trimmed
from the ids (`no_stop_trim` false) but still counted in `completion_tokens`.
"""

from __future__ import annotations

from typing import Any

import grpc.aio
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc as pb_grpc

from smg.backends.grpc.engines.base import (
    GrpcEngineClient,
    RawChunk,
    RawComplete,
    matched_stop,
    model_info,
    sampling_defaults,
)
from smg.backends.grpc.types import EngineInfo, GenerateCall

_CONSTRAINT_FIELDS = {
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf_grammar",
    "structural_tag": "structural_tag",
}


class TokenSpeedClient(GrpcEngineClient):
    """A TokenSpeed scheduler served over gRPC."""

    runtime = "tokenspeed"
    pb = pb
    delta_counts = False

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        return pb_grpc.TokenSpeedSchedulerStub(channel)

    def _engine_info(self, response: Any) -> EngineInfo:
        return model_info(
            model_path=response.model_path,
            served_model_name=response.served_model_name,
            tokenizer_path=response.tokenizer_path,
            max_context_length=response.max_context_length,
            eos_token_ids=list(response.eos_token_ids),
            vocab_size=response.vocab_size,
            supports_vision=response.supports_vision,
            model_type=response.model_type,
            default_sampling=sampling_defaults(response.default_sampling_params_json),
        )

    def _abort_request(self, request_id: str) -> Any:
        return pb.AbortRequest(request_id=request_id, reason="aborted by the gateway")

    def generate_request(self, call: GenerateCall) -> Any:
        params = pb.SamplingParams(
            temperature=call.temperature if call.temperature is not None else 1.0,
            top_p=call.top_p if call.top_p is not None else 1.0,
            top_k=call.top_k if call.top_k is not None else -1,
            min_p=call.min_p or 0.0,
            frequency_penalty=0.0,
            presence_penalty=0.0,
            repetition_penalty=call.repetition_penalty if call.repetition_penalty is not None else 1.0,
            stop=call.stop,
            stop_token_ids=call.stop_token_ids,
            ignore_eos=False,
            skip_special_tokens=True,
            spaces_between_special_tokens=True,
            no_stop_trim=False,
            n=1,
        )
        if call.max_tokens is not None:
            params.max_new_tokens = call.max_tokens
        if call.constraint is not None:
            kind, value = call.constraint
            setattr(params, _CONSTRAINT_FIELDS[kind], value)
        return pb.GenerateRequest(
            request_id=call.request_id,
            tokenized=pb.TokenizedInput(original_text=call.text, input_ids=call.input_ids),
            sampling_params=params,
            stream=call.stream,
        )

    def _read(self, response: Any) -> RawChunk | RawComplete | None:
        which = response.WhichOneof("response")
        if which == "chunk":
            c = response.chunk
            return RawChunk(list(c.token_ids), c.prompt_tokens, c.completion_tokens, c.cached_tokens)
        if which == "complete":
            c = response.complete
            token_id, stop_str = matched_stop(c)
            return RawComplete(
                output_ids=list(c.output_ids),
                finish_reason=c.finish_reason,
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                cached_tokens=c.cached_tokens,
                matched_token_id=token_id,
                matched_stop_str=stop_str,
            )
        return None
