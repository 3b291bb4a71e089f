"""The journal's durability contract, proved on a real gateway killed with SIGKILL under load.

A gateway (default journal settings) runs in front of the scripted HTTP worker; client threads
keep it busy with streamed and buffered requests, each with its own request id, and note when
each response was completely read. Then the gateway's process group gets SIGKILL while
requests are still in flight. Afterwards:

* the file passes `PRAGMA integrity_check`, reads, and takes new writes;
* every request whose response had completed more than one commit window before the kill is
  in the journal in full: its events numbered 1..n without gaps, `received` first and
  `completed` (status 200) last, and its summary row says so;
* every request in the journal, completed or not, holds a gap-free prefix of its events and a
  summary row that agrees with them (batches commit whole and in order).

The commit window (`journal.writer`): an event is lost by a kill only while it waits behind
the batch being written and the events queued ahead of it. Under this test's load (a few
thousand events per second against a writer that sustains far more, see
`tools/bench/journal.py`) that is milliseconds; `COMMIT_WINDOW_S` allows a full second, for a
loaded machine, plus the moment between the client reading the last byte and the gateway
appending `completed`. Nothing here asserts a speed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import httpx

from journal import summary
from journal.events import Completed, Received
from journal.reader import JournalReader
from journal.writer import JournalWriter
from tests.conftest import MODEL
from tools.spawn import Spawned, spawn_gateway, spawn_worker

COMMIT_WINDOW_S = 1.0
CLIENTS = 24
LOAD_BEFORE_KILL_S = 2.5


class Load:
    """Client threads sending requests until told to stop; completion times by request id."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.completed: dict[str, float] = {}  # request id -> time.monotonic() at the last byte
        self.failed = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(n,), daemon=True) for n in range(CLIENTS)]

    def client(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=10.0) as http:
            i = 0
            while not self.stop.is_set():
                i += 1
                request_id = f"dur-{n}-{i}"
                stream = i % 2 == 0
                body = {
                    "model": MODEL,
                    "max_tokens": 64,
                    "stream": stream,
                    "messages": [{"role": "user", "content": f"request {n} {i} " + "word " * 20}],
                }
                try:
                    response = http.post("/v1/messages", json=body, headers={"x-request-id": request_id})
                    ok = response.status_code == 200 and (not stream or b"message_stop" in response.content)
                except httpx.HTTPError:
                    ok = False
                done = time.monotonic()
                with self.lock:
                    if ok:
                        self.completed[request_id] = done
                    else:
                        self.failed += 1

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=20)


def test_kill_9_under_load_loses_at_most_the_last_commit_window(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    worker = spawn_worker(models=[MODEL])
    gateway: Spawned | None = None
    try:
        gateway = spawn_gateway([worker.url], journal=journal, extra=["--disable-retries"])
        with Load(gateway.url) as load:
            deadline = time.monotonic() + 30
            while len(load.completed) < CLIENTS and time.monotonic() < deadline:
                time.sleep(0.05)  # every client is up and running
            time.sleep(LOAD_BEFORE_KILL_S)
            with load.lock:
                failed_before = load.failed
            killed_at = time.monotonic()
            gateway.kill()
            time.sleep(0.3)  # in-flight requests fail now
        assert failed_before == 0, gateway.log()[-2000:]
        assert load.failed > 0  # the kill did land under load: requests were in flight
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()
    durable = sorted(rid for rid, done in load.completed.items() if done < killed_at - COMMIT_WINDOW_S)
    assert len(durable) > 100, "too little load to prove anything"

    conn = sqlite3.connect(journal)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()

    with JournalReader(journal) as reader:
        # Every request that completed before the last commit window is there, complete.
        for request_id in durable:
            raw = reader.raw_events(request_id)
            assert raw, request_id
            kinds = [kind for _, kind, _, _ in raw]
            assert [seq for seq, _, _, _ in raw] == list(range(1, len(raw) + 1)), request_id
            assert kinds[0] == "received" and kinds[-1] == "completed", (request_id, kinds)
            assert {"validated", "routed", "upstream"} <= set(kinds), (request_id, kinds)
            assert raw[-1][3]["status"] == 200
            row = reader.get_request(request_id)
            assert row is not None and row["completed"] is True and row["status"] == 200

        # Every request that is there at all holds a gap-free prefix of its events, and its
        # summary row agrees with them.
        rows = reader.list_requests(limit=1_000_000)
        for row in rows:
            events = reader.events(row["id"])
            assert events, row["id"]
            assert [seq for seq, _ in events] == list(range(1, len(events) + 1)), row["id"]
            assert isinstance(events[0][1], Received)
            folded: dict[str, object] = {}
            for _, event in events:
                summary.apply(folded, row["id"], event)
            assert row["completed"] is isinstance(events[-1][1], Completed)
            for key in ("status", "model", "backend", "stream", "stop_reason", "output_tokens"):
                expected = folded.get(key)
                assert row[key] == (bool(expected) if key == "stream" and expected is not None else expected), (
                    row["id"],
                    key,
                )
    lost = [rid for rid in load.completed if rid not in {r["client_id"] for r in rows if r["completed"]}]
    assert all(load.completed[rid] >= killed_at - COMMIT_WINDOW_S for rid in lost)
    oldest_lost = max((killed_at - load.completed[rid] for rid in lost), default=0.0)
    print(
        f"\n{len(load.completed)} responses completed, {len(durable)} more than {COMMIT_WINDOW_S:g} s before"
        f" the kill: all journaled in full; {len(lost)} later ones not complete in the journal, the oldest"
        f" completed {oldest_lost * 1000:.0f} ms before the kill; {len(rows)} requests in the journal;"
        f" {load.failed} requests failed by the kill"
    )

    # The file takes writes again.
    async def write_again() -> None:
        writer = JournalWriter(journal)
        await writer.start()
        await writer.append("after-the-crash", 1, Received(method="POST", path="/v1/messages", ts=time.time()))
        await writer.close()

    asyncio.run(write_again())
    with JournalReader(journal) as reader:
        assert reader.get_request("after-the-crash") is not None
