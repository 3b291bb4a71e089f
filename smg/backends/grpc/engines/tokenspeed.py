"""The TokenSpeed scheduler protocol (`tokenspeed.grpc.scheduler.TokenSpeedScheduler`).

Request: SGLang-like sampling values, but every scalar is `optional` so each is set explicitly
(top_k -1 when unset), `max_new_tokens`, stop strings sent, the constraint as `regex` /
`json_schema` / `ebnf_grammar` / `structural_tag`; a PD leg's rendezvous as `kv_bootstrap_info`.
Images travel as `mm_inputs` items (pixels as the item's `encoder_input`, `image_grid_thw`, the
placeholder range and token); an EPD prefill leg names each item's encode worker and room in
`encode_bootstrap_info`; a rank-pinned worker's rank (`--dp-aware`) as `data_parallel_rank`, each PD
leg its own. The encode worker's `TokenSpeedEncoder.Encode` is served on the same
address as its scheduler service, so one channel carries both.
Stream: chunks carry new ids and running-total counts; the streamed `complete` repeats the last
chunk's ids. A matched stop token is trimmed from the ids (`no_stop_trim` false) but still
counted in `completion_tokens`.
"""

from __future__ import annotations

from typing import Any

import grpc.aio
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import tokenspeed_encoder_pb2 as encoder_pb
from smg_grpc_proto.generated import tokenspeed_encoder_pb2_grpc as encoder_grpc
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc as pb_grpc

from smg.backends.grpc.engines.base import GrpcEngineClient, common_sampling, engine_error
from smg.backends.grpc.types import EngineError, GenerateCall
from smg.pipeline.vision import Tensor, VisionItem

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
    has_loads = True

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        return pb_grpc.TokenSpeedSchedulerStub(channel)

    def _abort_request(self, request_id: str) -> Any:
        return pb.AbortRequest(request_id=request_id, reason="aborted by the gateway")

    def generate_request(self, call: GenerateCall) -> Any:
        params = pb.SamplingParams(
            **common_sampling(call),
            top_k=call.top_k if call.top_k is not None else -1,
            stop=call.stop,
            no_stop_trim=False,
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
            stream=call.stream,
        )
        if call.images:
            request.mm_inputs.CopyFrom(
                pb.MultimodalInputs(items=[multimodal_item(i, pixels=call.send_pixels) for i in call.images])
            )
        if call.encode_bootstrap:
            request.encode_bootstrap_info.CopyFrom(
                pb.EncodeBootstrapInfo(
                    items=[
                        pb.EncodeItemBootstrapInfo(
                            item_index=b.item_index,
                            bootstrap_host=b.host,
                            bootstrap_port=b.port,
                            bootstrap_room=b.room,
                        )
                        for b in call.encode_bootstrap
                    ]
                )
            )
        if call.bootstrap is not None:
            request.kv_bootstrap_info.CopyFrom(
                pb.KvBootstrapInfo(
                    bootstrap_host=call.bootstrap.host,
                    bootstrap_port=call.bootstrap.port,
                    bootstrap_room=call.bootstrap.room,
                )
            )
        if call.dp_rank is not None:
            request.data_parallel_rank = call.dp_rank
        return request

    async def encode(self, request_id: str, image: VisionItem, room: int) -> None:
        """Hand one image to this encode worker, its embedding to be fetched by the prefill
        worker told `room`. Raises `EngineError` (code `NOT_ACCEPTED` when the worker declines)."""
        if self._channel is None:
            self.stub()
        stub = encoder_grpc.TokenSpeedEncoderStub(self._channel)
        request = encoder_pb.EncodeRequest(
            request_id=request_id,
            mm_inputs=pb.MultimodalInputs(items=[multimodal_item(image, pixels=True)]),
            items=[encoder_pb.EncodeItemAssignment(bootstrap_room=room)],
        )
        try:
            response = await stub.Encode(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise engine_error(exc) from None
        if not response.accepted:
            raise EngineError("NOT_ACCEPTED", "the encode worker did not accept the request")


def tensor(value: Tensor) -> Any:
    return pb.TensorData(shape=list(value.shape), dtype=value.dtype, inline=value.data)


def multimodal_item(image: VisionItem, *, pixels: bool) -> Any:
    """One image as a TokenSpeed `MultimodalItem` (`pixels`: with its encoder input)."""
    item = pb.MultimodalItem(
        modality=common_pb2.IMAGE,
        content_hash=image.content_hash,
        placeholders=[pb.PlaceholderRange(offset=image.offset, length=image.length)],
        placeholder_token_id=image.placeholder_token_id,
    )
    for name, value in image.model_tensors.items():
        item.model_specific_tensors[name].CopyFrom(tensor(value))
    if pixels:
        item.encoder_input.CopyFrom(tensor(image.pixel_values))
    return item
