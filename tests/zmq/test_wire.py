"""The ZMQ wire without sockets: addresses, the msgpack messages, and reading outputs as a newer
or older engine writes them."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest

from smg.backends.zmq import wire
from smg.backends.zmq.addresses import handshake_port, prepare_socket_dir, zmq_addresses
from smg.backends.zmq.client import model_dir_facts
from tests.zmq.conftest import QWEN3


def test_the_handshake_port_is_the_reference_gateways() -> None:
    # The reference's pinned vectors (model_gateway/src/routers/grpc/zmq_client.rs).
    assert handshake_port("/tmp/smg-zmq/ts0.ipc") == 25152
    assert handshake_port("/tmp/smg-zmq/engine-31000") == 22714
    assert all(20000 <= handshake_port(p) <= 29999 for p in ("", "a", "/x/y/z.ipc"))


def test_addresses_from_the_worker_url() -> None:
    found = zmq_addresses("ipc:///run/smg/w0")
    assert found.inputs == "ipc:///run/smg/w0-in.sock"
    assert found.outputs == "ipc:///run/smg/w0-out.sock"
    assert found.handshake == f"tcp://127.0.0.1:{handshake_port('/run/smg/w0')}"
    with pytest.raises(ValueError, match="ipc://PATH"):
        zmq_addresses("ipc://")
    with pytest.raises(ValueError, match="tcp://"):
        zmq_addresses("ipc:///x", "ipc:///y")


def test_the_socket_directory_is_made_private_and_stale_files_are_checked(tmp_path: Path) -> None:
    addresses = zmq_addresses(f"ipc://{tmp_path}/sockets/w0")
    prepare_socket_dir(addresses)
    assert (os.stat(tmp_path / "sockets").st_mode & 0o777) == 0o700
    (tmp_path / "sockets" / "w0-in.sock").write_text("not a socket")
    with pytest.raises(ValueError, match="not a socket"):
        prepare_socket_dir(addresses)


def test_add_request_is_the_nine_required_fields_in_order() -> None:
    params = wire.sampling_params(
        max_tokens=7, temperature=None, top_p=0.9, top_k=None, min_p=None, repetition_penalty=None,
        stop_token_ids=[5], eos_token_ids=[2, 3],
    )
    fields = msgpack.unpackb(wire.add_request("msg_1", [1, 2, 3], params), raw=False)
    assert len(fields) == 9
    assert fields[0] == "msg_1" and fields[1] == [1, 2, 3] and fields[2] is None and fields[4] is None
    assert isinstance(fields[5], float) and fields[6:] == [None, None, None]
    sent = fields[3]
    assert sent["_eos_token_id"] == 2
    assert sent["stop_token_ids"] == [5, 3]  # the other EOS ids stop too
    assert sent["_all_stop_token_ids"] == [2, 3, 5]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["max_tokens"]) == (1.0, 0.9, 0, 7)
    assert "stop" not in sent


def test_outputs_read_short_and_long_arrays() -> None:
    frame = msgpack.packb(
        [
            0,
            [["a", [11]], ["b", [12], None, None, None, 1], ["c", [2], None, None, None, 0, 201, None, None, "extra"]],
            {"num_running_reqs": 3, "num_waiting_reqs": 1, "kv_cache_usage": 0.5},
            12.5,
            None,
            ["d"],
            None,
            None,
            "weights-v1",
            "a field a newer engine appends",
        ]
    )
    batch = wire.outputs(frame)
    assert [(o.request_id, o.new_token_ids, o.finish_reason, o.stop_reason) for o in batch.outputs] == [
        ("a", [11], None, None),
        ("b", [12], "length", None),
        ("c", [2], "stop", 201),
    ]
    assert batch.scheduler_stats == {"num_running_reqs": 3, "num_waiting_reqs": 1, "kv_cache_usage": 0.5}
    assert batch.finished_requests == ["d"]
    assert wire.outputs(msgpack.packb([1, [], None, 1.0])).engine_index == 1
    with pytest.raises(ValueError):
        wire.outputs(msgpack.packb({"not": "an array"}))
    with pytest.raises(ValueError):
        wire.outputs(b"\xc1")


def test_handshake_messages() -> None:
    init = msgpack.unpackb(wire.init_message("ipc:///a-in.sock", "ipc:///a-out.sock"), raw=False)
    assert init["addresses"]["inputs"] == ["ipc:///a-in.sock"]
    assert init["addresses"]["outputs"] == ["ipc:///a-out.sock"]
    assert init["parallel_config"] == {}
    assert wire.handshake_status(msgpack.packb({"status": "HELLO", "local": False, "headless": True})) == "HELLO"
    assert wire.handshake_status(b"\xc1") == ""
    ready = wire.ready_response(msgpack.packb({"max_model_len": 2048, "vllm_version": "0.32.0", "new_key": 1}))
    assert (ready.max_model_len, ready.vllm_version) == (2048, "0.32.0")
    with pytest.raises(ValueError, match="max_model_len"):
        wire.ready_response(msgpack.packb({"status": "READY"}))


def test_the_model_directory_gives_eos_ids_and_vocabulary(tmp_path: Path) -> None:
    eos, vocab = model_dir_facts(str(QWEN3))
    assert eos and vocab
    (tmp_path / "config.json").write_text('{"eos_token_id": [7, 8], "vocab_size": 100}')
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [8, 9]}')
    assert model_dir_facts(str(tmp_path)) == ([7, 8, 9], 100)
    assert model_dir_facts("org/not-a-local-dir") == ([], None)


def test_tokenspeed_outputs_read_columns_and_the_appended_load() -> None:
    from smg.backends.zmq import tokenspeed

    batch = tokenspeed.outputs(
        msgpack.packb(
            ["BatchTokenIDOutSlim", ["a", "b"], [[10], []], ["", "stop"], [3, 4], [1, 7], [0, 0], [[], []], [[], []],
             1, 2, 5, 100, 400, "appended later"]
        )
    )
    assert [(o.request_id, o.new_token_ids, o.finish_reason, o.completion_tokens) for o in batch.outputs] == [
        ("a", [10], None, 1),
        ("b", [], "stop", 7),
    ]
    assert batch.engine_index == 1
    assert batch.scheduler_stats == {"num_running_reqs": 2, "num_waiting_reqs": 5, "kv_cache_usage": 0.25}
    older = tokenspeed.outputs(msgpack.packb(["BatchTokenIDOutSlim", [], [], [], [], [], [], [], []]))
    assert older.engine_index == 0 and older.scheduler_stats is None
    with pytest.raises(ValueError, match="ragged"):
        tokenspeed.outputs(msgpack.packb(["BatchTokenIDOutSlim", ["a"], [], [""], [1], [1], [0], [[]], [[]]]))
    with pytest.raises(ValueError):
        tokenspeed.outputs(msgpack.packb([0, [], None, 1.0]))
    request = msgpack.unpackb(tokenspeed.add_request("r", [1, 2], ["sp"]), raw=False)
    assert request == ["TokenizedGenerateReqInput", "r", None, None, [1, 2], ["sp"], False, -1, 0, None, True]
