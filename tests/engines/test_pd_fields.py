"""The disaggregation fields of a `GenerateCall` as each protocol spells them (sans I/O):
SGLang's `disaggregated_params`, TokenSpeed's `kv_bootstrap_info`, vLLM's `kv_transfer_params_json`
one way and back in a `complete`."""

from __future__ import annotations

from smg_grpc_proto.generated import vllm_engine_pb2

from smg.backends.grpc.engines import SglangClient, TokenSpeedClient, VllmClient
from smg.backends.grpc.types import Bootstrap, GenerateCall

ROOM_63 = 2**62 + 5


def test_sglang_carries_the_rendezvous_as_disaggregated_params() -> None:
    call = GenerateCall("r", [1, 2], bootstrap=Bootstrap("10.0.0.1", 8998, 2**31 - 1))
    params = SglangClient("x:1").generate_request(call).disaggregated_params
    assert (params.bootstrap_host, params.bootstrap_port, params.bootstrap_room) == ("10.0.0.1", 8998, 2**31 - 1)
    assert not SglangClient("x:1").generate_request(GenerateCall("r", [1])).HasField("disaggregated_params")


def test_tokenspeed_carries_a_63_bit_room_as_kv_bootstrap_info() -> None:
    call = GenerateCall("r", [1, 2], bootstrap=Bootstrap("h", 9000, ROOM_63))
    request = TokenSpeedClient("x:1").generate_request(call)
    assert request.kv_bootstrap_info.bootstrap_room == ROOM_63
    assert not request.HasField("encode_bootstrap_info")


def test_vllm_sends_and_reads_back_kv_transfer_params() -> None:
    client = VllmClient("x:1")
    request = client.generate_request(GenerateCall("r", [1], kv_transfer_params='{"do_remote_decode":true}'))
    assert request.kv_transfer_params_json == '{"do_remote_decode":true}'
    assert not client.generate_request(GenerateCall("r", [1])).HasField("kv_transfer_params_json")
    response = vllm_engine_pb2.GenerateResponse(
        complete=vllm_engine_pb2.GenerateComplete(output_ids=[7], finish_reason="length", kv_transfer_params_json="{}")
    )
    raw = client._read(response)
    assert raw is not None and getattr(raw, "kv_transfer_params", None) == "{}"
