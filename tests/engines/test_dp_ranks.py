"""Data-parallel ranks as each engine protocol spells them (sans I/O): the rank a `GenerateCall`
is pinned to in each `GenerateRequest`, the rank count a `GetServerInfo` answer names, and a
rank-pinned vLLM prefill leg."""

from __future__ import annotations

import json

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from smg_grpc_proto.generated import sglang_scheduler_pb2, tokenspeed_scheduler_pb2, vllm_engine_pb2

from smg.backends.grpc.discovery import dp_size_of
from smg.backends.grpc.engines import SglangClient, TokenSpeedClient, TrtllmClient, VllmClient
from smg.backends.grpc.engines.base import GrpcEngineClient
from smg.backends.grpc.pd import KvConnector, vllm_legs
from smg.backends.grpc.types import GenerateCall
from smg.routing.workers import Worker

PINNING = [SglangClient, VllmClient, TokenSpeedClient]


@pytest.mark.parametrize("client", PINNING, ids=lambda c: c.runtime)
def test_a_pinned_call_carries_its_rank_rank_0_included(client: type[GrpcEngineClient]) -> None:
    engine = client("x:1")
    for rank in (0, 3):
        request = engine.generate_request(GenerateCall("r", [1], dp_rank=rank))
        assert request.HasField("data_parallel_rank") and request.data_parallel_rank == rank
    assert not engine.generate_request(GenerateCall("r", [1])).HasField("data_parallel_rank")


def test_trtllm_has_no_rank_field_and_is_sent_none() -> None:
    request = TrtllmClient("x:1").generate_request(GenerateCall("r", [1], dp_rank=2))
    assert "data_parallel_rank" not in request.DESCRIPTOR.fields_by_name


def _struct(values: dict[str, object]) -> Struct:
    struct = Struct()
    struct.update(values)
    return struct


def test_the_rank_count_is_read_from_each_protocols_server_info() -> None:
    sglang = sglang_scheduler_pb2.GetServerInfoResponse(server_args=_struct({"dp_size": 4, "tp_size": 1}))
    tokenspeed = tokenspeed_scheduler_pb2.GetServerInfoResponse(server_args=_struct({"dp_size": 2}))
    vllm = vllm_engine_pb2.GetServerInfoResponse(data_parallel_size=8)
    as_dict = [MessageToDict(m, preserving_proto_field_name=True) for m in (sglang, tokenspeed, vllm)]
    assert [dp_size_of(info) for info in as_dict] == [4, 2, 8]
    # Not said (TRT-LLM, MLX, a vLLM field left 0, a ZMQ worker's engines) or nonsense: not known.
    for info in ({}, {"engines": [{"index": 0}]}, {"data_parallel_size": 0}, {"server_args": {"dp_size": 1.5}}):
        assert dp_size_of(info) is None


def _prefill(rank: int | None) -> Worker:
    return Worker(url="grpc://10.0.0.1:50051", connection="grpc", role="prefill", bootstrap_port=9000, dp_rank=rank)


def test_a_rank_pinned_vllm_prefill_leg_carries_its_rank_and_mooncake_names_its_core() -> None:
    call = GenerateCall("r", [1, 2], max_tokens=64, dp_rank=3)  # the decode leg's call, its own rank
    leg, decode_params = vllm_legs(call, KvConnector("MooncakeConnector", "engine-a"), _prefill(1))
    assert leg.dp_rank == 1 and leg.max_tokens == 1 and call.dp_rank == 3
    assert decode_params is not None and json.loads(decode_params)["remote_engine_id"] == "engine-a_dp1"
    _, unpinned = vllm_legs(call, KvConnector("MooncakeConnector", "engine-a"), _prefill(None))
    assert unpinned is not None and json.loads(unpinned)["remote_engine_id"] == "engine-a"
    nixl, _ = vllm_legs(call, KvConnector("NixlConnector"), _prefill(0))
    assert nixl.dp_rank == 0
