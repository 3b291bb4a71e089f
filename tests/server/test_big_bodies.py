"""Relayed bodies of megabytes do not stay in the gateway once their requests are over: its
resident memory comes back near where it started, however many came at once (a request's body
is let go of when it ends, though Sanic's request object lives on in the contexts its tasks
and timers copied; large blocks are mapped on their own, and cycles collected and free heap
trimmed after each large body)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tools.spawn import Spawned, spawn_gateway, spawn_worker

BODIES = 8
# Different texts, as real prompts are: nothing is shared between the copies.
TEXTS = [f"{i} " + "word " * (4 << 20) for i in range(BODIES)]  # 20 MiB each
SLACK_MB = 150  # what may stay: allocator caches, pools, imports done on first use


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Spawned]:
    worker = spawn_worker(models=["m"])
    try:
        # round_robin: the cache-aware policy keeps recent prompts by design (`--max-tree-size`).
        extra = ["--policy", "round_robin", "--header-read-timeout-secs", "300"]
        gateway = spawn_gateway([worker.url], journal=tmp_path / "journal.db", extra=extra)
        try:
            yield gateway
        finally:
            gateway.stop()
    finally:
        worker.stop()


def _post(url: str, text: str, results: list[int]) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    headers = {"content-type": "application/json"}
    results.append(
        httpx.post(url + "/v1/messages", content=orjson.dumps(body), headers=headers, timeout=300).status_code
    )


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the gateway's memory from /proc")
def test_the_memory_of_big_relayed_bodies_is_given_back(relay: Spawned) -> None:
    small = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(relay.url + "/v1/messages", json=small).status_code == 200
    start = _rss_mb(relay.proc.pid)
    results: list[int] = []
    threads = [threading.Thread(target=_post, args=(relay.url, text, results)) for text in TEXTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * BODIES
    # The journal writer lets go of a batch when it takes the next one: give it small ones.
    for _ in range(3):
        assert httpx.post(relay.url + "/v1/messages", json=small).status_code == 200
    # The release runs once the last request has ended: wait for it, within a deadline.
    deadline = time.monotonic() + 30
    while _rss_mb(relay.proc.pid) > start + SLACK_MB and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rss_mb(relay.proc.pid) <= start + SLACK_MB, f"started at {start:.0f} MB"


def test_a_big_relayed_body_is_journaled_as_received_and_found(relay: Spawned, tmp_path: Path) -> None:
    """The journal keeps a large body as the client sent it and indexes it and its answer, from
    the parses the gateway made for validation and for the answer's usage."""
    from journal.events import Received
    from journal.reader import JournalReader

    body = orjson.dumps(
        {
            "model": "m",
            "max_tokens": 8,
            "metadata": {"user_id": "u-big"},
            "messages": [
                {"role": "user", "content": "word " * (1 << 19)},
                {"role": "assistant", "content": "Yes."},
                {"role": "user", "content": "Zebra é?"},
            ],
        }
    )
    reply = httpx.post(
        relay.url + "/v1/messages", content=body, headers={"content-type": "application/json"}, timeout=300
    )
    assert reply.status_code == 200
    request_id = reply.headers["x-request-id"]
    with JournalReader(tmp_path / "journal.db") as reader:
        deadline = time.monotonic() + 30
        while (row := reader.get_request(request_id)) is None or not row.get("completed"):
            assert time.monotonic() < deadline, "the request was not journaled"
            time.sleep(0.1)
        (_, received), *_ = reader.events(request_id)
        assert isinstance(received, Received) and received.body is not None and received.body.encode() == body
        assert row["user_id"] == "u-big" and row["turns"] == 3
        while reader.count("zebra") == 0:  # the text index takes a completed request within a second
            assert time.monotonic() < deadline, "the request's text was not indexed"
            time.sleep(0.1)
        assert reader.count("zebra") == 1 and reader.count("echo") == 1  # the last turn's text, the answer's
