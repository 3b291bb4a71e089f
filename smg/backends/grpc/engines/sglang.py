"""The SGLang scheduler protocol (`sglang.grpc.scheduler.SglangScheduler`).

Request: sampling values with SGLang's neutral defaults (top_k -1 disables it), `max_new_tokens`,
no stop strings (the gateway matches them; single-token stops arrive as `stop_token_ids`), the
constraint as `regex` / `json_schema` / `ebnf_grammar` / `structural_tag`, `require_reasoning`;
a prefill/decode leg's rendezvous as `disaggregated_params`; a rank-pinned worker's rank
(`--dp-aware`) as `data_parallel_rank` (each PD leg its own: the proto has no field for the
prefill's rank on the decode leg, the room names the KV source); a prompt's images as one
`mm_inputs` batch (`smg.pipeline.vision.batch`): pixels, model tensors, the image token id and
each image's placeholder range in the expanded ids.
Stream: chunks carry new token ids and running-total counts; the streamed `complete` repeats the
last chunk's ids (a non-streamed one carries them all); stop and EOS tokens stay in the ids, the
match named in `matched_token_id` / `matched_stop_str`.
"""

from __future__ import annotations

from typing import Any

import grpc.aio
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from smg.backends.grpc.engines.base import GrpcEngineClient, common_sampling
from smg.backends.grpc.types import GenerateCall
from smg.pipeline.vision import VisionItem
from smg.pipeline.vision.batch import batch

_CONSTRAINT_FIELDS = {
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf_grammar",
    "structural_tag": "structural_tag",
}


class SglangClient(GrpcEngineClient):
    """An SGLang scheduler served over gRPC."""

    runtime = "sglang"
    pb = pb
    delta_counts = False
    has_loads = True

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        return pb_grpc.SglangSchedulerStub(channel)

    def _abort_request(self, request_id: str) -> Any:
        return pb.AbortRequest(request_id=request_id, reason="aborted by the gateway")

    def generate_request(self, call: GenerateCall) -> Any:
        params = pb.SamplingParams(
            **common_sampling(call), top_k=call.top_k if call.top_k is not None else -1, no_stop_trim=False
        )
        if call.max_tokens is not None:
            params.max_new_tokens = call.max_tokens
        if call.constraint is not None:
            kind, value = call.constraint
            setattr(params, _CONSTRAINT_FIELDS[kind], value)
        request = pb.GenerateRequest(
            request_id=call.request_id,
            tokenized=pb.TokenizedInput(original_text=call.text, input_ids=call.input_ids),
            sampling_params=params,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            stream=call.stream,
            require_reasoning=call.require_reasoning,
        )
        if call.dp_rank is not None:
            request.data_parallel_rank = call.dp_rank
        if call.bootstrap is not None:
            request.disaggregated_params.CopyFrom(
                pb.DisaggregatedParams(
                    bootstrap_host=call.bootstrap.host,
                    bootstrap_port=call.bootstrap.port,
                    bootstrap_room=call.bootstrap.room,
                )
            )
        if call.images:
            request.mm_inputs.CopyFrom(multimodal_inputs(call.images))
        return request


def multimodal_inputs(images: list[VisionItem]) -> Any:
    """A prompt's images as SGLang's `MultimodalInputs`."""
    joined = batch(images)
    out = pb.MultimodalInputs(
        pixel_values=pb.TensorData(
            data=joined.pixel_values.data, shape=list(joined.pixel_values.shape), dtype=joined.pixel_values.dtype
        ),
        modalities=["image"] * len(images),
        im_token_id=images[0].placeholder_token_id,
        mm_placeholders=[pb.PlaceholderRange(offset=i.offset, length=i.length) for i in images],
    )
    for name, value in joined.model_tensors.items():
        out.model_specific_tensors[name].CopyFrom(
            pb.TensorData(data=value.data, shape=list(value.shape), dtype=value.dtype)
        )
    return out
