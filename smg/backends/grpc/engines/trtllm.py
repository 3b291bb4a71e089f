"""The TensorRT-LLM protocol (`trtllm.TrtllmService`).

Request: the sampling values in a `SamplingConfig` (beam width 1, one sequence; top_k only when
the request set one — TRT-LLM reads an unset top_k as disabled), a required `max_tokens`, stop
strings sent (TRT-LLM tokenizes and matches them), the constraint as `guided_decoding`, input
ids excluded from the output, a prompt's images as `multimodal_input.image_data` (each image's
own bytes, in prompt order; TRT-LLM's input processor encodes them, the ids carry the
placeholders the gateway expanded). Stream: chunks carry new ids and running-total counts; the
`complete` carries every output id and the total. Stop tokens are left out of the output ids
(`include_stop_token_in_output` false). Health is a status string, "OK" when serving; model info
has no EOS ids and names the model by `model_id`.
"""

from __future__ import annotations

from typing import Any

import grpc.aio
from smg_grpc_proto.generated import trtllm_service_pb2 as pb
from smg_grpc_proto.generated import trtllm_service_pb2_grpc as pb_grpc

from smg.backends.grpc.engines.base import GrpcEngineClient, model_info
from smg.backends.grpc.types import EngineInfo, GenerateCall

# The Rust gateway's value when a request names no limit; the field is required.
DEFAULT_MAX_TOKENS = 2048

_GUIDE_TYPES = {
    "json_schema": pb.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA,
    "regex": pb.GuidedDecodingParams.GUIDE_TYPE_REGEX,
    "ebnf": pb.GuidedDecodingParams.GUIDE_TYPE_EBNF_GRAMMAR,
    "structural_tag": pb.GuidedDecodingParams.GUIDE_TYPE_STRUCTURAL_TAG,
}


class TrtllmClient(GrpcEngineClient):
    """A TensorRT-LLM engine served over gRPC."""

    runtime = "trtllm"
    pb = pb
    delta_counts = False
    output_ids_field = "output_token_ids"

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        return pb_grpc.TrtllmServiceStub(channel)

    def _healthy(self, response: Any) -> bool:
        return str(response.status).strip().lower() == "ok"

    def _engine_info(self, response: Any) -> EngineInfo:
        return model_info(
            model_path=response.model_id,
            max_context_length=response.max_seq_len or response.max_input_len,
            vocab_size=response.vocab_size,
        )

    def _abort_request(self, request_id: str) -> Any:
        return pb.AbortRequest(request_id=request_id)

    def generate_request(self, call: GenerateCall) -> Any:
        sampling = pb.SamplingConfig(
            beam_width=1,
            num_return_sequences=1,
            top_p=call.top_p if call.top_p is not None else 1.0,
            temperature=call.temperature if call.temperature is not None else 1.0,
            repetition_penalty=call.repetition_penalty if call.repetition_penalty is not None else 1.0,
        )
        if call.top_k is not None:
            sampling.top_k = call.top_k
        if call.min_p is not None:
            sampling.min_p = call.min_p
        request = pb.GenerateRequest(
            request_id=call.request_id,
            tokenized=pb.TokenizedInput(original_text=call.text, input_token_ids=call.input_ids),
            sampling_config=sampling,
            output_config=pb.OutputConfig(exclude_input_from_output=True),
            max_tokens=call.max_tokens if call.max_tokens is not None else DEFAULT_MAX_TOKENS,
            streaming=call.stream,
            stop=call.stop,
            stop_token_ids=call.stop_token_ids,
            ignore_eos=False,
            include_stop_token_in_output=False,
        )
        if call.constraint is not None:
            kind, value = call.constraint
            request.guided_decoding.CopyFrom(pb.GuidedDecodingParams(guide_type=_GUIDE_TYPES[kind], guide=value))
        if call.image_data:
            request.multimodal_input.CopyFrom(pb.MultimodalInput(image_data=call.image_data))
        return request
