"""The scripted engine's raw messages per runtime: the protocol shapes the clients normalise.

Read with plain synchronous stubs, so these pin what the engine sends (as the real servicers
do), independently of the clients under test.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from smg_grpc_proto.generated import (
    mlx_engine_pb2_grpc,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2_grpc,
    trtllm_service_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from smg.backends.grpc.engines import CLIENTS
from smg.backends.grpc.types import GenerateCall
from tests.engines.conftest import EngineUnderTest

EOS = 4002
STUBS: dict[str, Any] = {
    "sglang": sglang_scheduler_pb2_grpc.SglangSchedulerStub,
    "vllm": vllm_engine_pb2_grpc.VllmEngineStub,
    "trtllm": trtllm_service_pb2_grpc.TrtllmServiceStub,
    "tokenspeed": tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub,
    "mlx": mlx_engine_pb2_grpc.MlxEngineStub,
}

# (chunk token ids, chunk completion_tokens) and the complete's (ids, completion_tokens, matched)
# for the script [10, 11, 12] + EOS in chunks of 2, streamed.
STREAMED = {
    "sglang": ([([10, 11], 2), ([12, EOS], 4)], ([12, EOS], 4, {"matched_token_id": EOS})),
    "vllm": ([([10, 11], 2), ([12, EOS], 2)], ([12, EOS], 2, {})),
    "trtllm": ([([10, 11], 2), ([12], 3)], ([10, 11, 12], 3, {})),
    "tokenspeed": ([([10, 11], 2), ([12], 4)], ([12], 4, {"matched_token_id": EOS})),
    "mlx": ([([10, 11], 2), ([12, EOS], 4)], ([], 4, {"matched_stop_token_id": EOS})),
}


def raw_generate(runtime: str, url: str, stream: bool) -> list[dict[str, Any]]:
    request = CLIENTS[runtime](url).generate_request(GenerateCall("raw-1", [1, 2, 3], max_tokens=100, stream=stream))
    with grpc.insecure_channel(url.removeprefix("grpc://")) as channel:
        responses = STUBS[runtime](channel).Generate(request, timeout=10)
        return [MessageToDict(r, preserving_proto_field_name=True) for r in responses]


def test_streamed_messages_follow_the_runtime(engine: EngineUnderTest) -> None:
    engine.control.script({"token_ids": [10, 11, 12], "chunk_size": 2})
    messages = raw_generate(engine.runtime, engine.url, stream=True)
    chunks = [m["chunk"] for m in messages if "chunk" in m]
    completes = [m["complete"] for m in messages if "complete" in m]
    assert len(completes) == 1 and "complete" in messages[-1]
    expected_chunks, (ids, count, matched) = STREAMED[engine.runtime]
    assert [(c.get("token_ids", []), c.get("completion_tokens", 0)) for c in chunks] == expected_chunks
    complete = completes[0]
    ids_field = "output_token_ids" if engine.runtime == "trtllm" else "output_ids"
    assert complete.get(ids_field, []) == ids
    assert complete["completion_tokens"] == count
    assert complete["prompt_tokens"] == 3
    assert complete["finish_reason"] == "stop"
    for key in ("matched_token_id", "matched_stop_str", "matched_stop_token_id"):
        assert complete.get(key) == matched.get(key)


def test_non_streamed_complete_carries_every_id(engine: EngineUnderTest) -> None:
    engine.control.script({"token_ids": [10, 11, 12], "chunk_size": 2})
    messages = raw_generate(engine.runtime, engine.url, stream=False)
    assert len(messages) == 1 and "complete" in messages[0]
    complete = messages[0]["complete"]
    ids_field = "output_token_ids" if engine.runtime == "trtllm" else "output_ids"
    trimmed = engine.runtime in ("trtllm", "tokenspeed")
    assert complete[ids_field] == ([10, 11, 12] if trimmed else [10, 11, 12, EOS])
    assert complete["completion_tokens"] == (3 if engine.runtime == "trtllm" else 4)


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
def test_abort_as_the_engine_sends_it(runtime: str, engines: dict[str, Any]) -> None:
    from tools.engine_control import EngineControl

    url = engines[runtime].url
    with EngineControl(url) as control:
        control.reset()
        control.script({"token_ids": [10, 11, 12], "hold_after": 1})
        request = CLIENTS[runtime](url).generate_request(GenerateCall("raw-abort", [1, 2, 3], max_tokens=100))
        with grpc.insecure_channel(url.removeprefix("grpc://")) as channel:
            stub = STUBS[runtime](channel)
            responses = stub.Generate(request, timeout=10)
            first = next(responses)
            pb = sglang_scheduler_pb2 if runtime == "sglang" else vllm_engine_pb2
            if runtime == "sglang":
                stub.Abort(pb.AbortRequest(request_id="raw-abort"), timeout=10)
            else:
                stub.Abort(pb.AbortRequest(request_ids=["raw-abort"]), timeout=10)
            rest = [MessageToDict(r, preserving_proto_field_name=True) for r in responses]
        control.reset()
    assert list(first.chunk.token_ids) == [10]
    if runtime == "vllm":  # vLLM's last output is an empty delta, sent as a chunk first
        assert rest[0] == {"chunk": {"prompt_tokens": 3}}
        rest = rest[1:]
    assert len(rest) == 1
    assert rest[0]["complete"]["finish_reason"] == "abort"
