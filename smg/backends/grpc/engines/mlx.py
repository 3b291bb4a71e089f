"""The MLX engine protocol (`mlx.grpc.engine.MlxEngine`), as smg-grpc-servicer serves it.

Request: vLLM-like sampling values (top_k 0 when unset, unsigned), `max_tokens`, stop token ids
only: the protocol has no stop strings and no constraints (the gateway refuses both before a
request gets here, so they are not mapped). Stream: one chunk per token with running-total
counts; the streamed `complete` carries no ids, the non-streamed one all of them; a single-token
stop match (EOS included) is named in `matched_stop_token_id`. An aborted stream ends with no
`complete` at all.
"""

from __future__ import annotations

from typing import Any

import grpc.aio
from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc as pb_grpc

from smg.backends.grpc.engines.base import GrpcEngineClient, RawChunk, RawComplete, model_info
from smg.backends.grpc.types import EngineInfo, GenerateCall


class MlxClient(GrpcEngineClient):
    """An MLX engine served over gRPC."""

    runtime = "mlx"
    pb = pb
    delta_counts = False

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        return pb_grpc.MlxEngineStub(channel)

    def _engine_info(self, response: Any) -> EngineInfo:
        return model_info(
            model_path=response.model_path,
            served_model_name=response.served_model_name,
            max_context_length=response.max_context_length,
            eos_token_ids=list(response.eos_token_ids),
            vocab_size=response.vocab_size,
            model_type=response.model_type,
        )

    def _abort_request(self, request_id: str) -> Any:
        return pb.AbortRequest(request_ids=[request_id])

    def generate_request(self, call: GenerateCall) -> Any:
        params = pb.SamplingParams(
            temperature=call.temperature if call.temperature is not None else 1.0,
            top_p=call.top_p if call.top_p is not None else 1.0,
            top_k=max(call.top_k, 0) if call.top_k is not None else 0,
            min_p=call.min_p or 0.0,
            repetition_penalty=call.repetition_penalty if call.repetition_penalty is not None else 1.0,
            stop_token_ids=call.stop_token_ids,
            ignore_eos=False,
        )
        if call.max_tokens is not None:
            params.max_tokens = call.max_tokens
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
            return RawComplete(
                output_ids=list(c.output_ids),
                finish_reason=c.finish_reason,
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                cached_tokens=c.cached_tokens,
                matched_token_id=int(c.matched_stop_token_id) if c.HasField("matched_stop_token_id") else None,
            )
        return None
