"""gRPC prefill/decode and EPD over loopback: scripted engines in each role and runtime, both legs'
requests read back from the engines, JSON and SSE, each leg failing in turn, count_tokens and
`max_tokens: 0` answered by the gateway, the smaller window of a pair. Which pool and pair a
request reaches (IGW with a PD pool, another pair after a decode leg fails) and readiness by
role are tested in process: `test_pd_inprocess.py`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.events import Error, Routed, Tokens, Upstream
from journal.reader import JournalReader
from replay.offline import check
from smg.backends.grpc.pd import NIXL_PREFILL_PARAMS
from tests.conftest import wait_for_events
from tests.grpc.conftest import QWEN3, target_of
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway

MODEL = "pd-fixture"
DECODE_WINDOW = 256  # smaller than the prefill's: the pair's window
USER = [{"role": "user", "content": "Say hello."}]
BODY = {"model": MODEL, "max_tokens": 32, "messages": USER}


@dataclass
class Deployment:
    gateway: Spawned
    journal: Path
    legs: dict[str, Spawned]
    controls: dict[str, EngineControl]

    def url(self, role: str) -> str:
        return self.legs[role].url

    def post(self, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
        return httpx.post(self.gateway.url + path, json=body, timeout=30.0)


def _deploy(
    runtime: str, tmp: Path, *, epd: bool = False, bootstrap: str | None = "9123", prefill_extra: tuple[str, ...] = ()
) -> Iterator[Deployment]:
    roles = ("encode", "prefill", "decode") if epd else ("prefill", "decode")
    legs: dict[str, Spawned] = {}
    controls: dict[str, EngineControl] = {}
    gateway: Spawned | None = None
    try:
        for role in roles:
            extra = ["--served-model-name", MODEL, "--role", role]
            extra += ["--max-context-length", str(DECODE_WINDOW if role == "decode" else 4096)]
            extra += list(prefill_extra) if role == "prefill" else []
            legs[role] = spawn_engine(runtime, model_path=QWEN3, extra=extra)
            controls[role] = EngineControl(target_of(legs[role].url))
        journal = tmp / "pd.db"
        mode = ["--epd-disaggregation", "--encode", legs["encode"].url] if epd else ["--pd-disaggregation"]
        prefill = [legs["prefill"].url, *([bootstrap] if bootstrap else [])]
        gateway = spawn_gateway(
            [],
            journal=journal,
            extra=[
                *mode,
                "--prefill",
                *prefill,
                "--decode",
                legs["decode"].url,
                "--model-path",
                str(QWEN3),
                "--disable-retries",
            ],
        )
        yield Deployment(gateway, journal, legs, controls)
    finally:
        if gateway is not None:
            gateway.stop()
        for control in controls.values():
            control.close()
        for leg in legs.values():
            leg.stop()


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from _deploy("sglang", tmp_path_factory.mktemp("sglang-pd"))


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from _deploy("vllm", tmp_path_factory.mktemp("vllm-pd"), bootstrap=None)


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from _deploy(
        "vllm", tmp_path_factory.mktemp("vllm-mooncake"), prefill_extra=("--kv-connector", "MooncakeConnector")
    )


@pytest.fixture(scope="module")
def tokenspeed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from _deploy("tokenspeed", tmp_path_factory.mktemp("tokenspeed-epd"), epd=True)


@pytest.fixture
def pd(sglang: Deployment) -> Deployment:
    for control in sglang.controls.values():
        control.reset()
    return sglang


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in body.split("\n\n"):
        if frame.strip():
            name, data = frame.split("\n")[:2]
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


# --- SGLang: both legs at once, one room -----------------------------------------------------------


def test_sglang_pair_both_legs_get_one_room_and_the_client_gets_decode(pd: Deployment) -> None:
    pd.controls["decode"].script({"text": "Decoded answer."})
    pd.controls["prefill"].script({"text": "P"})
    reply = pd.post(BODY)
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["content"] == [{"type": "text", "text": "Decoded answer."}]
    (prefill,), (decode,) = pd.controls["prefill"].received(), pd.controls["decode"].received()
    assert prefill["request_id"] == decode["request_id"]
    assert prefill["request_id"].startswith(message["id"] + "-")
    assert prefill["disaggregated_params"] == decode["disaggregated_params"]
    params = decode["disaggregated_params"]
    assert params["bootstrap_host"] == "127.0.0.1" and params["bootstrap_port"] == 9123
    assert 0 <= params.get("bootstrap_room", 0) < 2**31
    assert prefill["tokenized"] == decode["tokenized"]
    assert message["usage"]["input_tokens"] == len(decode["tokenized"]["input_ids"])

    events = wait_for_events(pd.journal, reply.headers["x-request-id"])
    assert [e.worker for e in events if isinstance(e, Routed)] == [pd.url("prefill"), pd.url("decode")]
    # The tokens journaled are the decode leg's alone; the prefill leg is one ignored part.
    assert sum(len(e.ids) for e in events if isinstance(e, Tokens)) == message["usage"]["output_tokens"]
    (record,) = [e for e in events if isinstance(e, Upstream)]
    assert record.part == "prefill:complete" and record.worker == pd.url("prefill")
    assert events.index(record) < min(i for i, e in enumerate(events) if isinstance(e, Tokens))
    assert json.loads(record.data or "{}")["completion_tokens"] == 1


def test_sglang_pair_streams_the_decode_leg(pd: Deployment) -> None:
    pd.controls["decode"].script({"text": "Streamed from decode. STOP here", "chunk_size": 2})
    body = {**BODY, "stream": True, "stop_sequences": ["STOP"]}
    with httpx.stream("POST", pd.gateway.url + "/v1/messages", json=body) as response:
        assert response.status_code == 200
        frames = sse_events(response.read().decode())
    text = "".join(d["delta"]["text"] for name, d in frames if name == "content_block_delta")
    assert text == "Streamed from decode. "
    assert frames[0][0] == "message_start" and frames[-1][0] == "message_stop"
    assert [d["delta"]["stop_sequence"] for name, d in frames if name == "message_delta"] == ["STOP"]
    assert pd.controls["decode"].received()[0]["stream"] is True
    # The record is an ordinary gRPC one: offline replay rebuilds the answer from its tokens.
    report = check(wait_for_events(pd.journal, response.headers["x-request-id"]))
    assert report.identical and not report.partial, report.differences


def test_a_prefill_failure_is_the_answer_and_the_decode_leg_is_aborted(pd: Deployment) -> None:
    pd.controls["prefill"].script({"error": {"code": "INVALID_ARGUMENT", "message": "no KV room", "after_tokens": 0}})
    # The decode leg answers once (the KV handoff is over), then would go on: it is aborted.
    pd.controls["decode"].script({"text": "never seen by the client", "hold_after": 1})
    reply = pd.post({**BODY, "stream": True})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["message"] == "Prefill stream error: no KV room"
    assert reply.headers["x-smg-error-code"] == "prefill_stream_error"
    request_id = pd.controls["prefill"].received()[0]["request_id"]
    eventually(lambda: request_id in pd.controls["decode"].aborts(), "the decode leg aborted")
    events = wait_for_events(pd.journal, reply.headers["x-request-id"])
    assert [e.stage for e in events if isinstance(e, Error)] == ["prefill"]


def test_a_decode_failure_is_the_answer_after_the_prefill_completed(pd: Deployment) -> None:
    pd.controls["decode"].script({"error": {"code": "RESOURCE_EXHAUSTED", "message": "decode full", "after_tokens": 0}})
    with httpx.stream("POST", pd.gateway.url + "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 503
        assert "decode full" in response.read().decode()
    assert len(pd.controls["prefill"].received()) == 1


def test_a_decode_failure_midstream_ends_the_stream_with_an_error_event(pd: Deployment) -> None:
    pd.controls["decode"].script(
        {"text": "one two three four", "error": {"code": "INTERNAL", "message": "boom", "after_tokens": 2}}
    )
    with httpx.stream("POST", pd.gateway.url + "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        frames = sse_events(response.read().decode())
    assert frames[0][0] == "message_start" and frames[-1][0] == "error"
    assert "boom" in frames[-1][1]["error"]["message"]


def test_count_tokens_and_max_tokens_zero_are_answered_by_the_gateway(pd: Deployment) -> None:
    counted = pd.post({"model": MODEL, "messages": USER}, "/v1/messages/count_tokens")
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    empty = pd.post({**BODY, "max_tokens": 0})
    assert empty.status_code == 200, empty.text
    assert empty.json()["content"] == [] and empty.json()["usage"]["input_tokens"] == counted.json()["input_tokens"]
    assert pd.controls["prefill"].received() == [] and pd.controls["decode"].received() == []
    for reply in (counted, empty):  # journaled under the pool's one name, as its generations are
        routed = [e for e in wait_for_events(pd.journal, reply.headers["x-request-id"]) if isinstance(e, Routed)]
        assert [e.backend for e in routed] == ["grpc-pd"]


def test_the_pair_window_is_the_smaller_of_the_legs(pd: Deployment) -> None:
    models = httpx.get(pd.gateway.url + "/v1/models").json()["data"]
    assert [m.get("max_model_len") for m in models if m["id"] == MODEL] == [DECODE_WINDOW]
    long = [{"role": "user", "content": "word " * (DECODE_WINDOW + 10)}]
    reply = pd.post({**BODY, "messages": long})
    assert reply.status_code == 400
    assert reply.headers["x-smg-error-code"] == "context_length_exceeded"
    assert f"maximum context length is {DECODE_WINDOW} tokens" in reply.json()["error"]["message"]
    assert pd.controls["prefill"].received() == [] and pd.controls["decode"].received() == []


def test_a_tool_description_no_leg_can_hold_is_refused_untokenized(pd: Deployment) -> None:
    tools = [{"name": "t", "description": "word " * (400 << 10), "input_schema": {"type": "object"}}]  # 2 MiB
    reply = pd.post({**BODY, "tools": tools})
    assert reply.status_code == 400, reply.text
    assert reply.headers["x-smg-error-code"] == "context_length_exceeded"
    assert "However, your request has at least" in reply.json()["error"]["message"]
    events = wait_for_events(pd.journal, reply.headers["x-request-id"])
    assert [e.kind for e in events] == ["received", "validated", "error", "completed"]
    assert pd.controls["prefill"].received() == [] and pd.controls["decode"].received() == []
    with JournalReader(pd.journal) as reader:
        row = reader.get_request(reply.headers["x-request-id"])
    assert row is not None and row["model"] == MODEL  # a refused request records the model it asked for


def test_a_client_gone_midstream_aborts_the_decode_leg(pd: Deployment) -> None:
    pd.controls["decode"].script({"text": "a b c d e f g", "hold_after": 2})
    with httpx.stream("POST", pd.gateway.url + "/v1/messages", json={**BODY, "stream": True}) as response:
        gateway_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("event: content_block_delta"):
                break
    request_id = pd.controls["decode"].received()[0]["request_id"]
    eventually(lambda: request_id in pd.controls["decode"].aborts(), "the decode leg aborted")
    # The cut stream keeps its prompt's tokens (and so its cost): the decode leg's prompt.
    wait_for_events(pd.journal, gateway_id)
    with JournalReader(pd.journal) as reader:
        row = reader.get_request(gateway_id)
    prompt = len(pd.controls["decode"].received()[0]["tokenized"]["input_ids"])
    assert row is not None and row["model"] == MODEL and row["input_tokens"] == prompt > 0


# --- vLLM: prefill first, its KV params to decode ----------------------------------------------------


def test_vllm_pair_prefills_one_token_then_decodes_with_the_returned_kv_params(vllm: Deployment) -> None:
    for control in vllm.controls.values():
        control.reset()
    vllm.controls["decode"].script({"text": "From the vLLM decode leg."})
    with httpx.stream("POST", vllm.gateway.url + "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        frames = sse_events(response.read().decode())
    text = "".join(d["delta"]["text"] for name, d in frames if name == "content_block_delta")
    assert text == "From the vLLM decode leg."
    (prefill,), (decode,) = vllm.controls["prefill"].received(), vllm.controls["decode"].received()
    assert prefill["request_id"] == decode["request_id"]
    assert prefill["sampling_params"]["max_tokens"] == 1 and prefill.get("stream", False) is False
    assert prefill["kv_transfer_params_json"] == NIXL_PREFILL_PARAMS
    assert decode["sampling_params"]["max_tokens"] == 32 and decode["stream"] is True
    handoff = json.loads(decode["kv_transfer_params_json"])
    assert handoff["do_remote_prefill"] is True and handoff["remote_request_id"] == prefill["request_id"]
    assert handoff["remote_engine_id"] == f"scripted-prefill-{vllm.url('prefill').rsplit(':', 1)[1]}"
    assert "disaggregated_params" not in decode


def test_vllm_prefill_failure_never_reaches_decode(vllm: Deployment) -> None:
    for control in vllm.controls.values():
        control.reset()
    vllm.controls["prefill"].script({"error": {"code": "UNKNOWN", "message": "prefill died", "after_tokens": 0}})
    reply = vllm.post(BODY)
    assert reply.status_code == 500
    assert reply.json()["error"]["message"] == "Prefill stream error: prefill died"
    assert vllm.controls["decode"].received() == []


def test_vllm_mooncake_pair_gets_a_minted_transfer_id_on_both_legs(mooncake: Deployment) -> None:
    mooncake.controls["decode"].script({"text": "Mooncake decode."})
    reply = mooncake.post(BODY)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"][0]["text"] == "Mooncake decode."
    (prefill,), (decode,) = mooncake.controls["prefill"].received(), mooncake.controls["decode"].received()
    tagged, handoff = json.loads(prefill["kv_transfer_params_json"]), json.loads(decode["kv_transfer_params_json"])
    assert tagged["do_remote_decode"] is True and tagged["transfer_id"].startswith("xfer-")
    port = mooncake.url("prefill").rsplit(":", 1)[1]
    assert handoff == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": tagged["transfer_id"],
        "remote_engine_id": f"scripted-prefill-{port}",
        "remote_bootstrap_addr": "http://127.0.0.1:9123",
    }


# --- TokenSpeed EPD ----------------------------------------------------------------------------------


def test_tokenspeed_epd_serves_text_as_a_pair_with_kv_bootstrap_info(tokenspeed: Deployment) -> None:
    for control in tokenspeed.controls.values():
        control.reset()
    tokenspeed.controls["decode"].script({"text": "TokenSpeed decode."})
    reply = tokenspeed.post(BODY)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"][0]["text"] == "TokenSpeed decode."
    (prefill,), (decode,) = tokenspeed.controls["prefill"].received(), tokenspeed.controls["decode"].received()
    assert prefill["kv_bootstrap_info"] == decode["kv_bootstrap_info"]
    info = decode["kv_bootstrap_info"]
    assert info["bootstrap_host"] == "127.0.0.1" and info["bootstrap_port"] == 9123
    assert 0 <= int(info["bootstrap_room"]) < 2**63
    # A text request needs no encode leg.
    assert tokenspeed.controls["encode"].received() == [] and tokenspeed.controls["encode"].encoded() == []
    ready = httpx.get(tokenspeed.gateway.url + "/readiness")
    assert ready.status_code == 200, ready.text


def test_tokenspeed_epd_without_an_image_processor_refuses_images_before_any_leg(tokenspeed: Deployment) -> None:
    for control in tokenspeed.controls.values():
        control.reset()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    reply = tokenspeed.post({**BODY, "messages": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}]})
    assert reply.status_code == 400
    # The text fixture's config names no vision model: the gateway cannot preprocess its images.
    assert reply.headers["x-smg-error-code"] == "multimodal_config_missing"
    assert all(c.received() == [] and c.encoded() == [] for c in tokenspeed.controls.values())
