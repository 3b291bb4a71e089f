"""HTTP prefill/decode over loopback: both legs' bodies and headers, the decode leg's answer
relayed (streamed or not), each leg failing in turn, count_tokens on a prefill worker alone."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.events import Routed, Upstream
from journal.reader import JournalReader
from tests.conftest import Scripted, wait_for_events
from tools import anthropic_answers as answers
from tools.spawn import free_port, spawn_gateway, spawn_worker

MODEL = "pd-model"
BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "split me"}]}
HEADERS = {"authorization": "Bearer client", "x-request-id": "pd-1", "x-smg-routing-key": "k", "cookie": "no"}


def _pair(tmp_path: Path, journal_name: str, worker_extra: list[str], bootstrap: list[str]) -> Iterator[dict[str, Any]]:
    """A prefill worker, a decode worker and a PD gateway in front of them, stopped afterwards."""
    prefill = spawn_worker(models=[MODEL], extra=worker_extra)
    decode = spawn_worker(models=[MODEL], extra=worker_extra)
    journal = tmp_path / journal_name
    try:
        gw = spawn_gateway(
            [],
            journal=journal,
            extra=["--pd-disaggregation", "--prefill", prefill.url, *bootstrap, "--decode", decode.url]
            + ["--disable-retries"],
        )
        try:
            p, d = Scripted(prefill.url), Scripted(decode.url)
            yield {"gw": gw, "prefill": p, "decode": d, "journal": journal, "urls": (prefill.url, decode.url)}
        finally:
            gw.stop()
    finally:
        prefill.stop()
        decode.stop()


# The workers and gateway are shared by the module's tests; each test starts from empty scripts
# and empty request logs on both legs.
@pytest.fixture(scope="module")
def _sglang_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from _pair(tmp_path_factory.mktemp("pd"), "pd.db", [], ["8998"])


@pytest.fixture
def legs(_sglang_pair: dict[str, Any]) -> dict[str, Any]:
    _sglang_pair["prefill"].reset()
    _sglang_pair["decode"].reset()
    return _sglang_pair


def test_both_legs_get_the_request_with_one_bootstrap_room_and_the_client_gets_decode(legs: dict[str, Any]) -> None:
    gw, prefill, decode = legs["gw"], legs["prefill"], legs["decode"]
    prefill.script({"json": {"prefilled": True}})
    reply = httpx.post(gw.url + "/v1/messages", json=BODY, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    assert reply.json()["type"] == "message"  # the decode worker's echo, not the prefill's answer
    assert reply.headers["x-smg-routed-worker-id"] == legs["urls"][1]
    (first,), (second,) = prefill.received(), decode.received()
    for leg in (first, second):
        assert leg["path"] == "/v1/messages"
        assert leg["headers"]["authorization"] == "Bearer client" and "cookie" not in leg["headers"]
        assert leg["headers"]["x-smg-routing-key"] == "k"
        assert leg["json"]["messages"] == BODY["messages"] and leg["json"]["model"] == MODEL
    assert first["json"]["bootstrap_room"] == second["json"]["bootstrap_room"]
    assert 0 <= first["json"]["bootstrap_room"] < 2**63
    assert first["json"]["bootstrap_host"] == second["json"]["bootstrap_host"] == "127.0.0.1"
    assert first["json"]["bootstrap_port"] == 8998
    events = wait_for_events(legs["journal"], reply.headers["x-request-id"])
    parts = [e.part for e in events if isinstance(e, Upstream)]
    assert parts == ["prefill:head", "prefill:body", "head", "body"]
    assert [e.worker for e in events if isinstance(e, Routed)] == list(legs["urls"])


def test_a_stream_is_relayed_from_the_decode_leg(legs: dict[str, Any]) -> None:
    gw, decode = legs["gw"], legs["decode"]
    with httpx.stream("POST", gw.url + "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    assert text.startswith("event: message_start") and "event: message_stop" in text
    assert decode.received()[0]["json"]["stream"] is True


def test_a_decode_error_keeps_its_status_and_error(legs: dict[str, Any]) -> None:
    gw, decode = legs["gw"], legs["decode"]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "decode overloaded"}}
    decode.script({"status": 529, "json": error})
    reply = httpx.post(gw.url + "/v1/messages", json=BODY)
    assert reply.status_code == 529
    assert reply.json()["error"] == error["error"]


def test_a_prefill_error_is_the_answer(legs: dict[str, Any]) -> None:
    gw, prefill = legs["gw"], legs["prefill"]
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt too long for prefill"}}
    for stream in (False, True):
        prefill.script({"status": 400, "json": error})
        reply = httpx.post(gw.url + "/v1/messages", json={**BODY, "stream": stream})
        assert reply.status_code == 400
        assert reply.json()["error"] == error["error"]


def test_a_leg_that_drops_the_connection_is_a_502(legs: dict[str, Any]) -> None:
    gw, prefill, decode = legs["gw"], legs["prefill"], legs["decode"]
    prefill.script({"drop": True})
    reply = httpx.post(gw.url + "/v1/messages", json=BODY)
    assert reply.status_code == 502
    assert reply.headers["x-smg-error-code"] == "pd_disaggregation_request_failed"
    assert reply.json()["error"]["message"].startswith("Transport error: prefill leg")
    decode.script({"drop": True})
    reply = httpx.post(gw.url + "/v1/messages", json=BODY)
    assert reply.status_code == 502 and "decode leg" in reply.json()["error"]["message"]


def test_count_tokens_goes_to_one_prefill_worker_without_bootstrap_fields(legs: dict[str, Any]) -> None:
    gw, prefill, decode = legs["gw"], legs["prefill"], legs["decode"]
    body = {"model": MODEL, "messages": BODY["messages"]}
    reply = httpx.post(gw.url + "/v1/messages/count_tokens", json=body)
    assert reply.status_code == 200
    (seen,) = prefill.received()
    assert seen["path"] == "/v1/messages/count_tokens" and "bootstrap_room" not in seen["json"]
    assert decode.received() == []


def test_max_tokens_zero_and_unknown_models_are_refused_before_any_leg(legs: dict[str, Any]) -> None:
    gw, prefill, decode = legs["gw"], legs["prefill"], legs["decode"]
    zero = httpx.post(gw.url + "/v1/messages", json={**BODY, "max_tokens": 0})
    assert zero.status_code == 400 and zero.headers["x-smg-error-code"] == "max_tokens_zero_not_relayed"
    unknown = httpx.post(gw.url + "/v1/messages", json={**BODY, "model": "nobody"})
    assert unknown.status_code == 404 and unknown.headers["x-smg-error-code"] == "model_not_found"
    assert prefill.received() == [] and decode.received() == []


def test_a_role_without_available_workers_is_503_named_for_it(tmp_path: Path) -> None:
    prefill = spawn_worker(models=[MODEL])
    decode_port = free_port()
    decode = spawn_worker(decode_port, models=[MODEL])
    gw = spawn_gateway(
        [],
        extra=[
            "--pd-disaggregation",
            "--prefill",
            prefill.url,
            "--decode",
            decode.url,
            "--disable-retries",
            "--health-check-interval-secs",
            "1",
        ],
    )
    try:
        assert httpx.post(gw.url + "/v1/messages", json=BODY).status_code == 200
        decode.kill()
        deadline = time.monotonic() + 15
        codes: list[str] = []
        while time.monotonic() < deadline and "no_decode_servers" not in codes:
            codes.append(httpx.post(gw.url + "/v1/messages", json=BODY).headers.get("x-smg-error-code", ""))
            time.sleep(0.2)
        assert codes[-1] == "no_decode_servers"
        assert httpx.post(gw.url + "/v1/messages", json=BODY).status_code == 503
    finally:
        gw.stop()
        prefill.stop()
        decode.stop()


def test_launch_refuses_pd_without_both_roles() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--pd-disaggregation", "--prefill", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "--decode" in run.stderr


# --- vLLM: sequential, the prefill's KV params handed to decode ---------------------------------


@pytest.fixture(scope="module")
def _vllm_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from _pair(tmp_path_factory.mktemp("vllm-pd"), "vllm-pd.db", ["--owned-by", "vllm"], [])


@pytest.fixture
def vllm_legs(_vllm_pair: dict[str, Any]) -> dict[str, Any]:
    _vllm_pair["prefill"].reset()
    _vllm_pair["decode"].reset()
    return _vllm_pair


HANDOFF = {"do_remote_prefill": True, "remote_engine_id": "eng0", "remote_block_ids": [1, 2], "remote_host": "h"}


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_pair_prefills_sanitized_then_decodes_with_the_returned_kv_params(
    vllm_legs: dict[str, Any], stream: bool
) -> None:
    gw, prefill, decode = vllm_legs["gw"], vllm_legs["prefill"], vllm_legs["decode"]
    prefill.script({"json": {"type": "message", "content": [], "kv_transfer_params": HANDOFF}})
    body = {**BODY, "stream": stream, "stream_options": {"include_usage": True}, "n": 1, "min_tokens": 2}
    # One client id per request: both parametrizations journal into the module's one journal.
    reply = httpx.post(gw.url + "/v1/messages", json=body, headers={**HEADERS, "x-request-id": f"pd-vllm-{stream}"})
    assert reply.status_code == 200, reply.text
    if stream:
        assert "event: message_start" in reply.text  # the decode worker's streamed echo
    else:
        assert reply.json()["type"] == "message"
    (first,), (second,) = prefill.received(), decode.received()
    sent = first["json"]
    assert sent["stream"] is False and sent["max_tokens"] == 1 and sent["n"] == 1
    assert "stream_options" not in sent and "min_tokens" not in sent
    assert sent["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    assert sent["messages"] == BODY["messages"]
    decoded = second["json"]
    assert decoded["kv_transfer_params"] == HANDOFF
    assert decoded["stream"] is stream and decoded["max_tokens"] == BODY["max_tokens"] and decoded["min_tokens"] == 2
    for leg in (sent, decoded):
        assert not {"bootstrap_host", "bootstrap_port", "bootstrap_room"} & set(leg)
    for leg in (first, second):
        assert leg["headers"]["authorization"] == "Bearer client" and "cookie" not in leg["headers"]
    events = wait_for_events(vllm_legs["journal"], reply.headers["x-request-id"])
    assert [e.worker for e in events if isinstance(e, Routed)] == list(vllm_legs["urls"])
    parts = [e.part for e in events if isinstance(e, Upstream)]
    assert parts[:2] == ["prefill:head", "prefill:body"] and "head" in parts[2:]


def test_vllm_prefill_failure_is_the_answer_and_decode_is_never_sent(vllm_legs: dict[str, Any]) -> None:
    gw, prefill, decode = vllm_legs["gw"], vllm_legs["prefill"], vllm_legs["decode"]
    refusal = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    prefill.script({"status": 400, "json": refusal})
    reply = httpx.post(gw.url + "/v1/messages", json=BODY)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "no"
    assert decode.received() == []


def test_vllm_prefill_without_kv_params_lets_decode_recompute(vllm_legs: dict[str, Any]) -> None:
    gw, prefill, decode = vllm_legs["gw"], vllm_legs["prefill"], vllm_legs["decode"]
    prefill.script({"json": {"type": "message", "content": []}})
    reply = httpx.post(gw.url + "/v1/messages", json=BODY)
    assert reply.status_code == 200, reply.text
    (second,) = decode.received()
    assert "kv_transfer_params" not in second["json"]


def test_vllm_fan_out_skips_the_prefill_leg(vllm_legs: dict[str, Any]) -> None:
    gw, prefill, decode = vllm_legs["gw"], vllm_legs["prefill"], vllm_legs["decode"]
    reply = httpx.post(gw.url + "/v1/messages", json={**BODY, "n": 2})
    assert reply.status_code == 200, reply.text
    assert prefill.received() == [] and len(decode.received()) == 1


# --- --dp-aware: each rank a worker, each leg told its rank -------------------------------------


def test_dp_aware_pairs_pin_each_leg_to_its_rank(tmp_path: Path) -> None:
    sglang = ["--owned-by", "sglang"]
    prefill = spawn_worker(models=[MODEL], extra=[*sglang, "--dp-size", "2"])
    decode = spawn_worker(models=[MODEL], extra=[*sglang, "--dp-size", "3"])
    journal = tmp_path / "dp.db"
    gw = spawn_gateway(
        [],
        journal=journal,
        extra=["--pd-disaggregation", "--dp-aware", "--prefill", prefill.url, "8998", "--decode", decode.url,
               "--prefill-policy", "round_robin", "--decode-policy", "round_robin", "--disable-retries"],
    )
    p, d = Scripted(prefill.url), Scripted(decode.url)
    try:
        listed = httpx.get(gw.url + "/workers").json()["workers"]
        assert sorted(w["url"] for w in listed) == sorted(
            [f"{prefill.url}@0", f"{prefill.url}@1", f"{decode.url}@0", f"{decode.url}@1", f"{decode.url}@2"]
        )
        p.reset()
        d.reset()
        routed: list[list[str]] = []
        for _ in range(6):
            reply = httpx.post(gw.url + "/v1/messages", json=BODY)
            assert reply.status_code == 200, reply.text
            events = wait_for_events(journal, reply.headers["x-request-id"])
            routed.append([e.worker or "" for e in events if isinstance(e, Routed)])
        prefills, decodes = p.received(), d.received()
        for (prefill_worker, decode_worker), first, second in zip(routed, prefills, decodes, strict=True):
            prefill_rank, decode_rank = int(prefill_worker.rsplit("@", 1)[1]), int(decode_worker.rsplit("@", 1)[1])
            assert prefill_worker == f"{prefill.url}@{prefill_rank}" and decode_worker == f"{decode.url}@{decode_rank}"
            assert first["json"]["routed_dp_rank"] == prefill_rank and "disagg_prefill_dp_rank" not in first["json"]
            assert second["json"]["routed_dp_rank"] == decode_rank
            assert second["json"]["disagg_prefill_dp_rank"] == prefill_rank
            assert first["json"]["bootstrap_room"] == second["json"]["bootstrap_room"]
        assert {r[0] for r in routed} == {f"{prefill.url}@{i}" for i in range(2)}
        assert {r[1] for r in routed} == {f"{decode.url}@{i}" for i in range(3)}
    finally:
        gw.stop()
        prefill.stop()
        decode.stop()


def test_without_dp_aware_no_rank_fields_are_sent(legs: dict[str, Any]) -> None:
    reply = httpx.post(legs["gw"].url + "/v1/messages", json=BODY)
    assert reply.status_code == 200, reply.text
    for leg in (legs["prefill"].received()[0], legs["decode"].received()[0]):
        assert not {"routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank"} & set(leg["json"])


def test_a_decode_stream_cut_after_message_start_records_the_input_tokens_it_announced(legs: dict[str, Any]) -> None:
    gw, prefill, decode = legs["gw"], legs["prefill"], legs["decode"]
    prefill.script({"json": {"prefilled": True}})
    msg = answers.message(answers.text("a partial answer"), model=MODEL, usage=(777, 50))
    # message_start (announcing 777 input tokens), content_block_start, the first delta; then gone.
    decode.script(answers.sse_answer(msg, drop_after=3))
    with httpx.stream("POST", gw.url + "/v1/messages", json={**BODY, "stream": True}) as response:
        request_id = response.headers["x-request-id"]
        text = response.read().decode()
    # The decode leg's frames waited while the prefill leg was read: the client still gets
    # every one that arrived before the cut, then the error.
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names == ["message_start", "content_block_start", "content_block_delta", "error"], text
    wait_for_events(legs["journal"], request_id)
    with JournalReader(legs["journal"]) as reader:
        row = reader.get_request(request_id)
    assert row is not None and row["model"] == MODEL and row["input_tokens"] == 777
