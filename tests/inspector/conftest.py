"""Journals for the inspector tests: one written event by event, one from real gateway traffic."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console, RenderableType

from journal.events import (
    Block,
    Completed,
    Error,
    Event,
    Received,
    Rejected,
    Rendered,
    Routed,
    Tokens,
    Upstream,
    Validated,
)
from journal.reader import JournalReader
from journal.writer import JournalWriter
from tools.engine_control import EngineControl
from tools.spawn import spawn_engine, spawn_gateway, spawn_worker

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN3 = FIXTURES / "qwen3"
T0 = 1_750_000_000.0
SECRET = "sk-ant-INSPECTOR-SECRET"

# "Hello there, friend." in the qwen3 fixture tokenizer, one chunk of ids per tokens event.
GRPC_CHUNKS = [[868], [263, 261], [11], [509, 13]]


def text(renderable: RenderableType, width: int = 200) -> str:
    """What a renderable shows, as plain text."""
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def _body(model: str, stream: bool = False, content: str = "hi") -> str:
    return json.dumps(
        {"model": model, "max_tokens": 32, "stream": stream, "messages": [{"role": "user", "content": content}]}
    )


def _message(model: str, reply: str) -> dict[str, Any]:
    return {
        "id": "msg_relay",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": reply}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 3},
    }


def relay_ok(ts: float, model: str = "claude-relay", reply: str = "Hi from the relay") -> list[Event]:
    return [
        Received(
            method="POST",
            path="/v1/messages",
            headers={"x-api-key": SECRET, "content-type": "application/json", "anthropic-version": "2023-06-01"},
            body=_body(model),
            ts=ts,
        ),
        Validated(model=model, stream=False, t=0.0002),
        Routed(backend="http", worker="http://127.0.0.1:9001", model=model, t=0.0004),
        Upstream(part="head", status=200, headers={"content-type": "application/json"}, worker="w1", t=0.010),
        Upstream(part="body", data=json.dumps(_message(model, reply)), t=0.011),
        Completed(
            status=200,
            duration_ms=12.0,
            usage={"input_tokens": 5, "output_tokens": 3},
            stop_reason="end_turn",
            t=0.012,
        ),
    ]


def rejected(ts: float) -> list[Event]:
    return [
        Received(method="POST", path="/v1/messages", body='{"model": "x"}', ts=ts),
        Rejected(status=400, error_type="invalid_request_error", message="max_tokens: field required", t=0.0001),
        Completed(status=400, duration_ms=0.3, t=0.0003),
    ]


def upstream_failed(ts: float) -> list[Event]:
    return [
        Received(method="POST", path="/v1/messages", body=_body("claude-relay"), ts=ts),
        Validated(model="claude-relay", t=0.0001),
        Routed(backend="http", worker="http://127.0.0.1:9001", model="claude-relay", t=0.0002),
        Error(
            stage="upstream",
            status=502,
            error_type="api_error",
            message="worker unreachable: connection refused",
            code="upstream_unreachable",
            t=0.004,
        ),
        Completed(status=502, duration_ms=4.5, t=0.0045),
    ]


def grpc_stream(ts: float, model: str = "qwen3-fixture") -> list[Event]:
    events: list[Event] = [
        Received(method="POST", path="/v1/messages", body=_body(model, stream=True, content="Say hello."), ts=ts),
        Validated(model=model, stream=True, t=0.0002),
        Routed(backend="grpc", worker="grpc://127.0.0.1:5000", model=model, t=0.0005),
        Rendered(prompt_tokens=12, prompt_digest="ab" * 32, tokenizer=str(QWEN3), t=0.0006),
        Block(
            event={
                "type": "message_start",
                "message": {
                    "id": "msg_grpc",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 0},
                },
            },
            t=0.001,
        ),
        Block(
            event={"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, t=0.002
        ),
    ]
    pieces = ["Hello", " there", ",", " friend."]
    t = 0.003
    for n, (ids, piece) in enumerate(zip(GRPC_CHUNKS, pieces, strict=True), start=1):
        last = n == len(GRPC_CHUNKS)
        events.append(
            Tokens(
                ids=ids, completion_tokens=sum(map(len, GRPC_CHUNKS[:n])), finish_reason="stop" if last else None, t=t
            )
        )
        events.append(
            Block(
                event={"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}, t=t
            )
        )
        t += 0.001
    events += [
        Block(event={"type": "content_block_stop", "index": 0}, t=t),
        Block(
            event={
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 6},
            },
            t=t,
        ),
        Block(event={"type": "message_stop"}, t=t),
        Completed(status=200, duration_ms=t * 1000, stop_reason="end_turn", usage={"output_tokens": 6}, t=t),
    ]
    return events


def replay_of(original: str, ts: float) -> list[Event]:
    events = relay_ok(ts, reply="Hi from the replay")
    received = events[0]
    assert isinstance(received, Received)
    received.headers = {**received.headers, "x-smg-replay-of": original}
    return events


async def write_journal(path: Path, requests: dict[str, list[Event]]) -> Path:
    writer = JournalWriter(path)
    await writer.start()
    for request_id, events in requests.items():
        for seq, event in enumerate(events, start=1):
            if isinstance(event, Received):
                event.request_id = request_id
            await writer.append(request_id, seq, event)
    await writer.close()
    return path


def sample_requests(fillers: int = 0) -> dict[str, list[Event]]:
    """Five kinds of request (ids `req_relay`, `req_rejected`, `req_failed`, `req_grpc`,
    `req_replay`, oldest first), after `fillers` older relay requests `req_fill_000`…"""
    out: dict[str, list[Event]] = {}
    for i in range(fillers):
        out[f"req_fill_{i:03d}"] = relay_ok(T0 - 10_000 + i, model="filler-model")
    out["req_relay"] = relay_ok(T0 + 1)
    out["req_rejected"] = rejected(T0 + 2)
    out["req_failed"] = upstream_failed(T0 + 3)
    out["req_grpc"] = grpc_stream(T0 + 4)
    out["req_replay"] = replay_of("req_relay", T0 + 5)
    return out


@pytest.fixture
async def sample_journal(tmp_path: Path) -> Path:
    return await write_journal(tmp_path / "sample.db", sample_requests())


# --- real traffic ---------------------------------------------------------------------------


def _wait_completed(journal: Path, count: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = 0
        if journal.exists():
            try:
                with JournalReader(journal) as reader:
                    done = sum(1 for r in reader.list_requests(100) if r["completed"])
            except Exception:
                done = 0
        if done >= count:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"only {done} of {count} requests completed in {journal}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def real_journal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One journal written by two live gateways: an HTTP relay in front of the scripted worker
    (a success and a validation refusal) and the gRPC path in front of the scripted engine (a
    generated stream). Yields the path and the request ids."""
    path = tmp_path_factory.mktemp("inspector-real") / "smg-journal.db"
    ids: dict[str, Any] = {"path": path}
    worker = spawn_worker(models=["scripted-model"])
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", "qwen3-fixture"])
    gateways = []
    try:
        relay = spawn_gateway([worker.url], journal=path, extra=["--disable-retries"])
        gateways.append(relay)
        grpc = spawn_gateway([engine.url], journal=path, extra=["--model-path", str(QWEN3)])
        gateways.append(grpc)
        control = EngineControl(engine.url)
        control.script({"text": "Hello there, friend."})
        control.close()
        user = [{"role": "user", "content": "Say hello."}]
        with httpx.Client(timeout=30.0) as http:
            ok = http.post(
                f"{relay.url}/v1/messages",
                json={"model": "scripted-model", "max_tokens": 16, "messages": user},
                headers={"x-api-key": SECRET},
            )
            ids["relay"] = ok.headers["x-request-id"]
            bad = http.post(f"{relay.url}/v1/messages", json={"model": "scripted-model", "messages": user})
            assert bad.status_code == 400
            ids["rejected"] = bad.headers["x-request-id"]
            streamed = http.post(
                f"{grpc.url}/v1/messages",
                json={"model": "qwen3-fixture", "max_tokens": 64, "stream": True, "messages": user},
            )
            assert streamed.status_code == 200, streamed.text
            ids["grpc"] = streamed.headers["x-request-id"]
            ids["grpc_body"] = streamed.text
            for _ in range(2):  # a client that reuses its request id
                reused = http.post(
                    f"{relay.url}/v1/messages",
                    json={"model": "scripted-model", "max_tokens": 16, "messages": user},
                    headers={"x-request-id": "inspector-reused"},
                )
                assert reused.headers["x-request-id"] == "inspector-reused"
        _wait_completed(path, 5)
        yield ids
    finally:
        for gateway in gateways:
            gateway.stop()
        engine.stop()
        worker.stop()


# --- a gateway's writer, on a thread of its own --------------------------------------------


class LiveWriter:
    """Relay requests written through `JournalWriter` on a thread with its own event loop,
    `per_tick` every `tick_s` (10 per 0.1 s: 100 a second), each one completing a tick after
    it arrived, as a gateway under load leaves them in flight for a moment. `written` counts
    the requests whose first events are committed; `wait_for(n)` blocks until n are."""

    def __init__(self, path: Path, *, per_tick: int = 10, tick_s: float = 0.1, prefix: str = "req_live") -> None:
        self.path = path
        self.per_tick = per_tick
        self.tick_s = tick_s
        self.prefix = prefix
        self.written = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-writer", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> LiveWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.written >= count or self.error is not None, timeout):
                raise AssertionError(f"the writer wrote {self.written} of {count} requests")

    def _run(self) -> None:
        try:
            asyncio.run(self._write())
        except BaseException as exc:  # reported by __exit__
            self.error = exc
            with self._cond:
                self._cond.notify_all()

    async def _write(self) -> None:
        writer = JournalWriter(self.path)
        await writer.start()
        try:
            n = 0
            pending: list[tuple[str, list[Event]]] = []
            while not self._stop.is_set():
                for request_id, events in pending:  # last tick's requests complete
                    for seq, event in enumerate(events[3:], start=4):
                        await writer.append(request_id, seq, event)
                pending = []
                for _ in range(self.per_tick):
                    request_id = f"{self.prefix}_{n:05d}"
                    events = relay_ok(time.time())
                    events[0].request_id = request_id  # type: ignore[attr-defined]
                    for seq, event in enumerate(events[:3], start=1):
                        await writer.append(request_id, seq, event)
                    pending.append((request_id, events))
                    n += 1
                await writer.flush()
                with self._cond:
                    self.written = n
                    self._cond.notify_all()
                await asyncio.sleep(self.tick_s)
        finally:
            await writer.close()
