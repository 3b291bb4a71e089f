"""The vLLM engine protocol (`vllm.grpc.engine.VllmEngine`), as smg-grpc-servicer serves it.

Request: `max_tokens`, top_k 0 when unset (vLLM's "disabled"; the field is unsigned, so a
negative request value is sent as 0 too), stop strings sent (vLLM matches them as well; the
gateway still trims), the constraint as `json_schema` / `regex` / `grammar` / `structural_tag`;
a PD leg's KV connector params as `kv_transfer_params_json` (a prefill's `complete` returns the
decode leg's in the same field); a rank-pinned worker's rank (`--dp-aware`) as `data_parallel_rank`;
a prompt's images as one `mm_inputs` batch (`smg.pipeline.vision.batch`): pixels, model tensors
with their batched and flat keys, the image token id, each image's placeholder range in the
expanded ids and its content hash (hex).
Stream: every chunk's `completion_tokens` counts that chunk only, and the streamed `complete`
repeats the last chunk's ids and count; a non-streamed `complete` carries every id and the total.
Output ids include a matched stop or EOS token; `matched_token_id` is set for a `stop_token_ids`
hit, `matched_stop_str` for a stop string, neither for the model's primary EOS.
"""

from __future__ import annotations

from typing import Any

import grpc.aio
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from smg.backends.grpc.engines.base import GrpcEngineClient, RawChunk, RawComplete, common_sampling
from smg.backends.grpc.types import GenerateCall
from smg.pipeline.vision import VisionItem
from smg.pipeline.vision.batch import batch

_CONSTRAINT_FIELDS = {
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "grammar",
    "structural_tag": "structural_tag",
}


class VllmClient(GrpcEngineClient):
    """A vLLM engine served over gRPC."""

    runtime = "vllm"
    pb = pb
    delta_counts = True
    has_loads = True

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        return pb_grpc.VllmEngineStub(channel)

    def _abort_request(self, request_id: str) -> Any:
        return pb.AbortRequest(request_ids=[request_id])

    def generate_request(self, call: GenerateCall) -> Any:
        params = pb.SamplingParams(
            **common_sampling(call), top_k=max(call.top_k, 0) if call.top_k is not None else 0, stop=call.stop
        )
        if call.max_tokens is not None:
            params.max_tokens = call.max_tokens
        if call.constraint is not None:
            kind, value = call.constraint
            setattr(params, _CONSTRAINT_FIELDS[kind], value)
        request = pb.GenerateRequest(
            request_id=call.request_id,
            tokenized=pb.TokenizedInput(original_text=call.text, input_ids=call.input_ids),
            sampling_params=params,
            stream=call.stream,
        )
        if call.dp_rank is not None:
            request.data_parallel_rank = call.dp_rank
        if call.kv_transfer_params is not None:
            request.kv_transfer_params_json = call.kv_transfer_params
        if call.images:
            request.mm_inputs.CopyFrom(multimodal_inputs(call.images))
        return request

    def _read(self, response: Any) -> RawChunk | RawComplete | None:
        raw = super()._read(response)
        if isinstance(raw, RawComplete) and response.complete.HasField("kv_transfer_params_json"):
            raw.kv_transfer_params = response.complete.kv_transfer_params_json
        return raw


def multimodal_inputs(images: list[VisionItem]) -> Any:
    """A prompt's images as vLLM's `MultimodalInputs`."""
    joined = batch(images)
    out = pb.MultimodalInputs(
        pixel_values=pb.TensorData(
            inline=joined.pixel_values.data, shape=list(joined.pixel_values.shape), dtype=joined.pixel_values.dtype
        ),
        im_token_id=images[0].placeholder_token_id,
        mm_placeholders=[pb.PlaceholderRange(offset=i.offset, length=i.length) for i in images],
        mm_hashes=[i.content_hash.hex() for i in images],
        batched_keys=joined.batched_keys,
    )
    for name, value in joined.model_tensors.items():
        out.model_specific_tensors[name].CopyFrom(
            pb.TensorData(inline=value.data, shape=list(value.shape), dtype=value.dtype)
        )
    for name, sizes in joined.flat_keys.items():
        out.flat_keys[name] = sizes
    return out
