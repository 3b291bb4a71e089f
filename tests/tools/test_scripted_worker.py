"""The scripted worker over real HTTP, and the spawn helpers that start it."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tools.spawn import Spawned, free_port, spawn, spawn_worker

EVENT_ORDER = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_delta",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]


@pytest.fixture(scope="module")
def worker() -> Iterator[Spawned]:
    spawned = spawn_worker(models=["m1", "m2"])
    try:
        yield spawned
    finally:
        spawned.stop()


@pytest.fixture
def client(worker: Spawned) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.url, timeout=10.0) as c:
        c.post("/_reset").raise_for_status()
        yield c


def _request(text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {
        "model": "m1",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def _script(client: httpx.Client, *answers: dict[str, Any], path: str | None = None) -> None:
    body: dict[str, Any] = {"answers": list(answers)}
    if path is not None:
        body["path"] = path
    response = client.post("/_script", json=body)
    assert response.status_code == 200, response.text


def _events(text: str) -> list[tuple[str | None, str]]:
    """(event, data) pairs of an SSE body; every frame must end with a blank line."""
    assert text.endswith("\n\n")
    out: list[tuple[str | None, str]] = []
    for frame in text[:-2].split("\n\n"):
        event = None
        data = []
        for line in frame.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        out.append((event, "\n".join(data)))
    return out


def _process_alive(marker: str) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


# --- default answers ---------------------------------------------------------------------------


def test_default_echo_json(client: httpx.Client) -> None:
    body = _request(system="be brief", text="hello big world")
    body["messages"] = [
        {"role": "user", "content": "first turn"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "hello big world"}]},
    ]
    response = client.post("/v1/messages", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    message = response.json()
    assert message["id"].startswith("msg_")
    assert {k: v for k, v in message.items() if k != "id"} == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "echo: hello big world"}],
        "model": "m1",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 8,
            "output_tokens": 4,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def test_default_echo_stream(client: httpx.Client) -> None:
    response = client.post("/v1/messages", json=_request("hi you", stream=True))
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers.get("transfer-encoding") == "chunked"
    assert "[DONE]" not in response.text
    events = _events(response.text)
    assert [e for e, _ in events] == EVENT_ORDER
    datas = [orjson.loads(d) for _, d in events]
    assert [d["type"] for d in datas] == EVENT_ORDER
    assert datas[0]["message"]["content"] == []
    assert datas[0]["message"]["model"] == "m1"
    deltas = [d["delta"]["text"] for d in datas if d["type"] == "content_block_delta"]
    assert deltas == ["echo:", " hi", " you"]
    assert datas[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {
            "output_tokens": 3,
            "input_tokens": 2,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert datas[-1] == {"type": "message_stop"}


def test_default_count_tokens(client: httpx.Client) -> None:
    response = client.post("/v1/messages/count_tokens", json=_request("one two three", system="s"))
    assert response.status_code == 200
    assert response.json() == {"input_tokens": 4}


def test_malformed_body_gets_anthropic_error(client: httpx.Client) -> None:
    response = client.post("/v1/messages", content=b"{not json")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/_received").json()["requests"][0]["body"] == "{not json"


# --- scripted answers --------------------------------------------------------------------------


def test_scripted_answers_in_fifo_order(client: httpx.Client) -> None:
    _script(
        client,
        {"status": 200, "headers": {"x-first": "1"}, "json": {"answer": 1}},
        {"status": 503, "headers": {"retry-after": "7"}, "body": "overloaded"},
        {"status": 429, "headers": {"content-type": "application/json"}, "body": '{"e": 1}'},
        {"sse": [{"event": "ping", "data": {"type": "ping"}}, {"data": "plain"}]},
    )
    assert client.get("/_script").json() == {"pending": {"/v1/messages": 4}}

    first = client.post("/v1/messages", json=_request())
    assert (first.status_code, first.json(), first.headers["x-first"]) == (200, {"answer": 1}, "1")

    second = client.post("/v1/messages", json=_request())
    assert (second.status_code, second.text) == (503, "overloaded")
    assert second.headers["retry-after"] == "7"

    third = client.post("/v1/messages", json=_request())
    assert (third.status_code, third.headers["content-type"]) == (429, "application/json")
    assert third.json() == {"e": 1}

    fourth = client.post("/v1/messages", json=_request())
    assert fourth.headers["content-type"] == "text/event-stream"
    assert fourth.text == 'event: ping\ndata: {"type":"ping"}\n\ndata: plain\n\n'

    # The queue is empty again: back to the default echo.
    assert client.post("/v1/messages", json=_request("x")).json()["content"][0]["text"] == "echo: x"


def test_answers_keyed_on_the_body_fit_whatever_the_arrival_order(client: httpx.Client) -> None:
    _script(
        client,
        {"when_body_contains": "[beta]", "status": 503, "body": "beta is down"},
        {"when_body_contains": "[alpha]", "json": {"answer": "alpha"}, "repeat": True},
        {"json": {"answer": "anyone"}},
    )
    assert client.post("/v1/messages", json=_request("[beta] hi")).status_code == 503
    for _ in range(2):  # `repeat` keeps it queued; the unkeyed answer is left for another request
        assert client.post("/v1/messages", json=_request("[alpha] hi")).json() == {"answer": "alpha"}
    assert client.post("/v1/messages", json=_request("[beta] again")).json() == {"answer": "anyone"}
    echoed = client.post("/v1/messages", json=_request("[beta] once more")).json()
    assert echoed["content"][0]["text"] == "echo: [beta] once more"
    assert client.get("/_script").json() == {"pending": {"/v1/messages": 1}}


def test_in_flight_counts_the_requests_answered_at_once(client: httpx.Client, worker: Spawned) -> None:
    _script(client, {"delay_ms": 300, "json": {"a": 1}, "when_body_contains": "[slow]", "repeat": True})
    assert client.get("/_in_flight").json() == {"in_flight": 0, "max": 0}

    async def three() -> None:
        async with httpx.AsyncClient(base_url=worker.url, timeout=10.0) as http:
            await asyncio.gather(*(http.post("/v1/messages", json=_request("[slow]")) for _ in range(3)))

    asyncio.run(three())
    counts = client.get("/_in_flight").json()
    assert counts["in_flight"] == 0 and 1 <= counts["max"] <= 3
    arrivals = sorted(r["in_flight"] for r in client.get("/_received").json()["requests"])
    assert arrivals[-1] == counts["max"]
    client.post("/_reset").raise_for_status()
    assert client.get("/_in_flight").json() == {"in_flight": 0, "max": 0}


def test_queues_are_per_path(client: httpx.Client) -> None:
    _script(client, {"json": {"input_tokens": 99}}, path="/v1/messages/count_tokens")
    assert client.post("/v1/messages", json=_request("a")).json()["content"][0]["text"] == "echo: a"
    counted = client.post("/v1/messages/count_tokens", json=_request("a"))
    assert counted.json() == {"input_tokens": 99}


def test_sse_is_written_event_by_event(client: httpx.Client) -> None:
    frames = [{"event": f"e{i}", "data": {"i": i}} for i in range(3)]
    _script(client, {"sse": frames, "chunk_delay_ms": 150})
    arrivals = []
    with client.stream("POST", "/v1/messages", json=_request()) as response:
        for chunk in response.iter_raw():
            arrivals.append((time.monotonic(), chunk))
    assert [c for _, c in arrivals] == [f'event: e{i}\ndata: {{"i":{i}}}\n\n'.encode() for i in range(3)]
    assert arrivals[-1][0] - arrivals[0][0] >= 0.25


def test_raw_entries_write_exact_bytes(client: httpx.Client) -> None:
    split = [{"raw": "event: message_st"}, {"raw": 'art\ndata: {"a":'}, {"raw": "1}\n\n"}]
    _script(client, {"sse": split, "chunk_delay_ms": 20})
    response = client.post("/v1/messages", json=_request())
    assert response.text == 'event: message_start\ndata: {"a":1}\n\n'


def test_delay_before_status_line(client: httpx.Client) -> None:
    _script(client, {"delay_ms": 300})
    started = time.monotonic()
    response = client.post("/v1/messages", json=_request("late"))
    assert time.monotonic() - started >= 0.3
    assert response.json()["content"][0]["text"] == "echo: late"


def test_stream_echo_regardless_of_request(client: httpx.Client) -> None:
    _script(client, {"stream_echo": True})
    response = client.post("/v1/messages", json=_request("a b"))
    assert [e for e, _ in _events(response.text)][-1] == "message_stop"


def test_drop_closes_without_answer(client: httpx.Client) -> None:
    _script(client, {"drop": True})
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/v1/messages", json=_request())
    assert client.get("/health").status_code == 200
    assert len(client.get("/_received").json()["requests"]) == 1


def test_drop_after_aborts_mid_stream(client: httpx.Client) -> None:
    frames = [{"event": f"e{i}", "data": {"i": i}} for i in range(4)]
    _script(client, {"sse": frames, "drop_after": 2})
    received = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", "/v1/messages", json=_request()) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                received.append(chunk)
    assert b"".join(received) == b'event: e0\ndata: {"i":0}\n\nevent: e1\ndata: {"i":1}\n\n'


# --- recording, health, models, control errors -------------------------------------------------


def test_records_requests_in_order(client: httpx.Client) -> None:
    raw = orjson.dumps(_request("recorded"))
    client.post(
        "/v1/messages?beta=true",
        content=raw,
        headers={"X-Api-Key": "k", "Anthropic-Version": "2023-06-01", "content-type": "application/json"},
    )
    client.post("/v1/messages/count_tokens", json=_request("counted"))
    requests = client.get("/_received").json()["requests"]
    assert [(r["method"], r["path"]) for r in requests] == [
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
    ]
    first = requests[0]
    assert first["query"] == "beta=true"
    assert first["body"] == raw.decode()
    assert first["json"] == _request("recorded")
    assert first["headers"]["x-api-key"] == "k"
    assert first["headers"]["anthropic-version"] == "2023-06-01"
    assert all(name == name.lower() for name in first["headers"])
    assert first["time"] <= requests[1]["time"]

    assert client.delete("/_received").status_code == 200
    assert client.get("/_received").json() == {"requests": []}


def test_health_toggle_and_reset(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.post("/_health", json={"healthy": False}).status_code == 200
    assert client.get("/health").status_code == 503
    assert client.post("/_health", json={"healthy": True}).status_code == 200
    assert client.get("/health").status_code == 200

    client.post("/_health", json={"healthy": False})
    _script(client, {"json": {}})
    client.post("/v1/messages", json=_request())
    client.post("/_reset")
    assert client.get("/health").status_code == 200
    assert client.get("/_received").json() == {"requests": []}
    assert client.get("/_script").json() == {"pending": {}}


def test_models_openai_shape(client: httpx.Client) -> None:
    assert client.get("/v1/models").json() == {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "scripted", "max_model_len": 4096}
            for m in ("m1", "m2")
        ],
    }


def test_models_anthropic_shape() -> None:
    extra = ["--api-format", "anthropic", "--max-model-len", "8192"]
    with spawn_worker(models=["a", "b"], extra=extra) as anthropic_worker:
        listing = httpx.get(f"{anthropic_worker.url}/v1/models").json()
    assert listing == {
        "data": [
            {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"} for m in ("a", "b")
        ],
        "has_more": False,
        "first_id": "a",
        "last_id": "b",
    }
    assert anthropic_worker.proc.poll() is not None


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"answers": {}}',
        b'{"path": "/elsewhere", "answers": []}',
        b'{"answers": [1]}',
        b'{"answers": [{"stauts": 200}]}',
        b'{"answers": [{"status": 99}]}',
        b'{"answers": [{"headers": {"a": 1}}]}',
        b'{"answers": [{"json": {}, "body": "x"}]}',
        b'{"answers": [{"body": 3}]}',
        b'{"answers": [{"sse": [{"event": "x"}]}]}',
        b'{"answers": [{"sse": "x"}]}',
        b'{"answers": [{"json": {}, "drop_after": 1}]}',
        b'{"answers": [{"delay_ms": -1}]}',
        b'{"answers": [{"json": {}}, {"drop": "yes"}]}',
        b'{"answers": [{"when_body_contains": ""}]}',
        b'{"answers": [{"when_body_contains": 3}]}',
        b'{"answers": [{"repeat": 1}]}',
    ],
)
def test_malformed_script_is_400(client: httpx.Client, body: bytes) -> None:
    response = client.post("/_script", content=body)
    assert response.status_code == 400
    assert "error" in response.json()
    # Nothing from a rejected script is queued, and the worker still serves.
    assert client.get("/_script").json() == {"pending": {}}
    assert client.post("/v1/messages", json=_request("ok")).status_code == 200


def test_malformed_health_is_400(client: httpx.Client) -> None:
    assert client.post("/_health", json={"healthy": "no"}).status_code == 400
    assert client.post("/_health", content=b"nope").status_code == 400
    assert client.get("/health").status_code == 200


# --- spawn helpers -----------------------------------------------------------------------------


def test_stop_is_idempotent_and_kill_is_final() -> None:
    spawned = spawn_worker()
    try:
        spawned.kill()
        assert spawned.proc.returncode is not None
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{spawned.url}/health", timeout=1.0)
    finally:
        spawned.stop()
        spawned.stop()
    assert "Starting worker" in spawned.log()


def test_spawn_reports_early_exit_with_log_tail(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    args = [sys.executable, "-c", "print('boom from child'); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match="boom from child") as info:
        spawn(args, ready_url=url, url=url, timeout=10.0, log_dir=tmp_path)
    assert "exited with 3" in str(info.value)


def test_spawn_timeout_stops_the_process(tmp_path: Path) -> None:
    marker = f"smg-spawn-test-{uuid.uuid4().hex}"
    url = f"http://127.0.0.1:{free_port()}"
    args = [sys.executable, "-c", f"import time; print('{marker}', flush=True); time.sleep(60)"]
    with pytest.raises(RuntimeError, match=marker):
        spawn(args, ready_url=url, url=url, timeout=1.0, log_dir=tmp_path)
    assert not _process_alive(marker)
