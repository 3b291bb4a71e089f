"""JournalWriter on a real SQLite file: round trip, group commit, flush, close, failures."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from journal import packed
from journal.events import (
    Block,
    Completed,
    Event,
    Received,
    Rejected,
    Routed,
    Tokens,
    Upstream,
    Validated,
)
from journal.reader import JournalReader
from journal.writer import JournalWriter, NullJournal


def streaming_request(ts: float = 1_700_000_000.25) -> list[Event]:
    return [
        Received(
            method="POST",
            path="/v1/messages",
            headers={"content-type": "application/json"},
            body='{"model":"claude-x","max_tokens":64,"stream":true,"messages":[]}',
            client="127.0.0.1",
            tenant="team-a",
            ts=ts,
        ),
        Validated(model="claude-x", stream=True, summary={"max_tokens": 64}, t=0.0004),
        Routed(backend="grpc", worker="grpc://127.0.0.1:5000", model="qwen", t=0.001),
        Tokens(ids=[1, 2, 3], prompt_tokens=12, completion_tokens=3, t=0.020),
        Block(
            event={
                "type": "message_start",
                "message": {"id": "msg_1", "usage": {"input_tokens": 12, "output_tokens": 1}},
            },
            t=0.0205,
        ),
        Block(
            event={
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": ""},
            },
            t=0.021,
        ),
        Block(
            event={
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "ünïcödé ✓"},
            },
            t=0.022,
        ),
        Block(event={"type": "content_block_stop", "index": 0}, t=0.023),
        Block(
            event={
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "tu_1", "name": "f", "input": {}},
            },
            t=0.024,
        ),
        Block(
            event={
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 9},
            },
            t=0.030,
        ),
        Block(event={"type": "message_stop"}, t=0.031),
        Completed(status=200, duration_ms=31.5, bytes_sent=2048, t=0.0315),
    ]


async def wait_until(condition: Any, timeout: float = 20.0) -> None:
    """Poll `condition` (bounded: a writer that never gets there fails the test)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def write(path: Path, requests: dict[str, list[Event]]) -> JournalWriter:
    writer = JournalWriter(path)
    await writer.start()
    for request_id, events in requests.items():
        for seq, event in enumerate(events):
            await writer.append(request_id, seq, event)
    await writer.close()
    return writer


def db_count(path: Path, sql: str | None = None) -> int:
    """`sql`'s count; by default the events stored (a packed row holds several, journal.packed)."""
    conn = sqlite3.connect(path)
    try:
        if sql is not None:
            return int(conn.execute(sql).fetchone()[0])
        return sum(
            packed.count(data) if kind == packed.RUN_KIND else 1
            for kind, data in conn.execute("SELECT kind, data FROM events")
        )
    finally:
        conn.close()


async def test_round_trip_events_and_summary(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    events = streaming_request()
    writer = await write(path, {"req_1": events})
    assert writer.stats["events_written"] == len(events)

    with JournalReader(path) as reader:
        assert reader.events("req_1") == list(enumerate(events))
        row = reader.get_request("req_1")
    assert row == {
        "id": "req_1",
        "ts": 1_700_000_000.25,
        "method": "POST",
        "path": "/v1/messages",
        "tenant": "team-a",
        "model": "qwen",
        "backend": "grpc",
        "worker": "grpc://127.0.0.1:5000",
        "stream": True,
        "status": 200,
        "error_code": None,
        "error_type": None,
        "stop_reason": "tool_use",
        "input_tokens": 12,
        "output_tokens": 9,
        "ttfe_ms": 20.5,
        "duration_ms": 31.5,
        "bytes_sent": 2048,
        "replay_of": None,
        "completed": True,
        "has_tool_use": True,
        "has_thinking": True,
        "bodies": "full",
        "client_id": None,
        "trace_id": None,
        "user_id": None,
        "session_id": None,
        "key_fp": None,
        "thread_key": None,  # no message to key a conversation by
        "turns": 0,
        "hung_up": False,
        "cut_mid_stream": False,
        "cost_usd": None,  # no price table
        "replica": None,  # a local file names no replica
    }


async def test_search_columns_and_text_are_written_with_the_summary(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    events = streaming_request()
    received = events[0]
    assert isinstance(received, Received)
    received.headers = {
        "traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "x-api-key": "sk-ant-secret",
        "x-claude-code-session-id": "cc-1",
    }
    received.body = '{"model":"claude-x","metadata":{"user_id":"u-9"},"messages":[{"role":"user","content":"Zebra?"}]}'
    cut = [e for e in events if not (isinstance(e, Block) and e.event["type"] == "message_stop")]
    await write(path, {"req_1": events, "req_2": cut})
    with JournalReader(path) as reader:
        row = reader.get_request("req_1")
        assert row is not None
        assert row["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert row["user_id"] == "u-9" and row["session_id"] == "cc-1" and row["thread_key"] == "s:cc-1"
        assert row["key_fp"] is not None and len(row["key_fp"]) == 12 and row["turns"] == 1
        assert reader.count("zebra") == 2  # the user's text
        assert reader.count("unicode") == 2  # the thinking delta, accents folded
        assert reader.count("cut:yes") == 1 and reader.get_request("req_2")["cut_mid_stream"] is True  # type: ignore[index]
        assert reader.count(f"key:{row['key_fp']} trace:4bf92f3577b34da6a3ce929d0e0e4736") == 2
        assert "sk-ant-secret" not in str(reader.connection.execute("SELECT body FROM request_text").fetchall())


async def test_summary_built_across_batches_and_late_events(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    events = streaming_request()
    for seq, event in enumerate(events):
        await writer.append("req_1", seq, event)
        await writer.flush()  # one event per batch
    assert writer.stats["batches"] == len(events)
    # An event after `completed` (its summary is gone from memory) must not erase the row.
    await writer.append("req_1", len(events), Tokens(ids=[9], t=0.5))
    await writer.close()
    with JournalReader(path) as reader:
        row = reader.get_request("req_1")
    assert row is not None
    assert (row["model"], row["status"], row["ttfe_ms"], row["completed"]) == (
        "qwen",
        200,
        20.5,
        True,
    )


def _summary_rows(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT * FROM requests ORDER BY id").fetchall()
    finally:
        conn.close()


async def test_a_summary_committed_in_pieces_is_the_summary_committed_at_once(tmp_path: Path) -> None:
    # Later commits of a request change only the columns that differ from its last commit
    # (so SQLite rewrites only their indexes); the row must end up exactly as one commit of
    # all the events makes it, at every split of the events into batches.
    events = streaming_request()
    rejected = [
        Received(method="POST", path="/v1/messages", body="{}"),
        Rejected(status=400, code="x", error_type="invalid_request_error", message="no"),
    ]
    whole = tmp_path / "whole.db"
    await write(whole, {"req_s": events, "req_r": rejected})
    for every in (1, 2, 3, 5):
        pieces = tmp_path / f"pieces-{every}.db"
        writer = JournalWriter(pieces)
        await writer.start()
        statements: list[str] = []
        assert writer._conn is not None
        writer._conn.set_trace_callback(statements.append)
        for request_id, evs in (("req_s", events), ("req_r", rejected)):
            for seq, event in enumerate(evs):
                await writer.append(request_id, seq, event)
                if seq % every == every - 1:
                    await writer.flush()
        await writer.close()
        assert _summary_rows(pieces) == _summary_rows(whole), every
        if every < len(events):
            assert any(sql.startswith("UPDATE requests SET") for sql in statements)
    # Completion, after the stream was committed, touches the columns it changes, no others.
    updates = [sql for sql in statements if sql.startswith("UPDATE requests SET")]
    assert updates and all("model =" not in sql and "trace_id =" not in sql for sql in updates), updates


async def test_rejected_request_summary(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    events: list[Event] = [
        Received(method="POST", path="/v1/messages", body="{", ts=time.time()),
        Rejected(
            status=400,
            error_type="invalid_request_error",
            message="bad json",
            code="invalid_json",
            t=0.001,
        ),
        Completed(status=400, duration_ms=1.2, bytes_sent=120, t=0.0012),
    ]
    await write(path, {"req_bad": events})
    with JournalReader(path) as reader:
        row = reader.get_request("req_bad")
    assert row is not None
    assert row["status"] == 400
    assert row["error_code"] == "invalid_json"
    assert row["error_type"] == "invalid_request_error"
    assert row["ttfe_ms"] is None
    assert row["model"] is None


async def test_an_idle_writer_gathers_a_request_into_one_commit(tmp_path: Path) -> None:
    # The first event finds the writer idle; the rest of its request, appended after the
    # writer task has taken it, still joins the same commit (within `commit_interval_s`).
    writer = JournalWriter(tmp_path / "j.db", commit_interval_s=1.0)
    await writer.start()
    events = streaming_request()
    await writer.append("req_1", 0, events[0])
    for _ in range(20):  # the writer task runs and takes the first event
        await asyncio.sleep(0)
    assert writer.stats["queue_depth"] == 0
    for seq, event in enumerate(events[1:], 1):
        await writer.append("req_1", seq, event)
    await writer.flush()
    stats = writer.stats
    await writer.close()
    assert (stats["batches"], stats["events_written"]) == (1, len(events))


async def test_group_commit_batches(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    n = 10_000
    # A task that counts the event loop's turns: while the queue has room, no `append` may
    # give the loop up (the hot path never waits on the disk, nor on the writer).
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    before = turns
    for i in range(n):
        await writer.append(f"req_{i // 10}", i % 10, Tokens(ids=[i], t=i / 1000))
    suspended = turns - before
    counter.cancel()
    await writer.flush()
    stats = writer.stats
    await writer.close()

    assert stats["events_written"] == n
    assert stats["batches"] < n // 100  # group commit, not one commit per event
    assert stats["max_batch_seen"] > 1
    assert stats["queue_depth"] == 0
    assert suspended == 0  # no append gave up the loop
    assert db_count(path) == n
    assert db_count(path, "SELECT count(*) FROM requests") == n // 10


async def test_backpressure_on_a_full_queue(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, queue_size=8, max_batch=4)
    await writer.start()
    for i in range(500):
        await writer.append("req_1", i, Tokens(ids=[i]))
    await writer.flush()
    assert writer.stats["events_written"] == 500
    assert writer.stats["max_batch_seen"] <= 4
    await writer.close()
    assert db_count(path) == 500


async def test_flush_makes_events_visible_to_readers(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.flush()  # before start: nothing to wait for
    await writer.start()
    await writer.flush()  # idle: returns at once
    for seq, event in enumerate(streaming_request()):
        await writer.append("req_1", seq, event)
    await writer.flush()
    with JournalReader(path) as reader:  # a second connection, writer still open
        assert len(reader.events("req_1")) == len(streaming_request())
        assert reader.count() == 1
    await writer.append("req_2", 0, Received(method="GET", path="/health"))
    await writer.flush()
    with JournalReader(path) as reader:
        assert reader.count() == 2
    await writer.close()


async def test_close_drains_and_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    for i in range(3000):
        await writer.append("req_1", i, Tokens(ids=[i]))
    await writer.close()  # no flush: close must drain
    await writer.close()
    assert db_count(path) == 3000
    await writer.append("req_1", 3000, Tokens(ids=[0]))  # after close: dropped, no error
    assert writer.stats["events_dropped"] == 1
    assert db_count(path) == 3000


async def test_events_appended_before_start_are_written(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.append("req_1", 0, Received(method="POST", path="/v1/messages"))
    await writer.start()
    await writer.close()
    assert db_count(path) == 1


async def test_a_bad_event_does_not_cost_the_batch_or_the_task(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    await writer.append("req_1", 0, Tokens(ids=[1]))
    await writer.append("req_1", 0, Tokens(ids=[2]))  # duplicate seq: a caller bug
    await writer.append("req_2", 0, Tokens(ids=[3]))
    await writer.flush()
    assert writer.stats["events_dropped"] == 1
    await writer.append("req_2", 1, Tokens(ids=[4]))  # the task is still alive
    await writer.close()
    assert db_count(path) == 3
    with JournalReader(path) as reader:
        assert [e for _, e in reader.events("req_1")] == [Tokens(ids=[1])]


async def test_null_journal_does_nothing(tmp_path: Path) -> None:
    journal = NullJournal()
    await journal.start()
    await journal.append("req_1", 0, Received(method="POST", path="/v1/messages"))
    await journal.flush()
    await journal.close()
    await journal.close()
    assert journal.stats == {
        "events_written": 0,
        "batches": 0,
        "max_batch_seen": 0,
        "queue_depth": 0,
    }
    assert list(tmp_path.iterdir()) == []


async def test_upstream_events_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    events: list[Event] = [
        Received(method="POST", path="/v1/messages", ts=1.0),
        Upstream(part="head", status=200, headers={"content-type": "text/event-stream"}, t=0.01),
        Upstream(part="chunk", data="event: ping\ndata: {}\n\n", t=0.02),
        Upstream(part="chunk", data="AAEC", encoding="base64", t=0.03),
        Completed(status=200, duration_ms=40.0, t=0.04),
    ]
    await write(path, {"req_relay": events})
    with JournalReader(path) as reader:
        assert reader.events("req_relay") == list(enumerate(events))
        row = reader.get_request("req_relay")
    assert row is not None and row["ttfe_ms"] == 10.0


_KILLED_WRITER = """
import asyncio, os, signal, sys
from journal.events import Tokens
from journal.writer import JournalWriter

async def main():
    writer = JournalWriter(sys.argv[1])
    await writer.start()
    for i in range(1000):
        await writer.append("req_1", i, Tokens(ids=[i]))
    await writer.flush()
    for i in range(1000, 2000):
        await writer.append("req_1", i, Tokens(ids=[i]))  # queued, never flushed
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_committed_batches_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    written = db_count(path)
    assert 1000 <= written <= 2000  # everything flushed survived; the unflushed tail may not


async def test_a_locked_file_delays_a_batch_but_does_not_lose_it(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, busy_timeout_ms=50, retry_interval_s=0.05)
    await writer.start()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the file
    for seq, event in enumerate(streaming_request()):
        await writer.append("req_1", seq, event)
    await wait_until(lambda: writer.problem is not None)
    assert "locked" in (writer.problem or "")
    other.execute("COMMIT")
    other.close()
    await wait_until(lambda: writer.problem is None)
    await writer.close()
    assert writer.stats["events_dropped"] == 0 and writer.stats["incidents"] == 1
    assert db_count(path) == len(streaming_request())


def test_a_long_text_is_encoded_a_window_at_a_time_to_the_same_bytes() -> None:
    """`encode` escapes a text of megabytes in windows; joined, they are what one escape of the
    whole payload gives, byte for byte, whatever straddles a window's edge."""
    import orjson

    from journal.writer import ESCAPE_WINDOW_CHARS, LONG_TEXT_CHARS, encode

    edge = ESCAPE_WINDOW_CHARS - 1
    body = "x" * edge + '"é\n\\' + "\u2028😀\x01" * 3 + "y" * LONG_TEXT_CHARS
    event = Received(method="POST", path="/v1/messages", headers={"a": "b"}, body=body, ts=1.5)
    assert encode(event) == orjson.dumps(event.to_dict())
    surrogate = Received(method="POST", path="/v1/messages", body="z" * edge + "\udc80" + "z" * 10)
    assert orjson.loads(encode(surrogate))["body"] == "z" * edge + "\\udc80" + "z" * 10


async def test_a_large_received_body_is_stored_as_the_bytes_encoded(tmp_path: Path) -> None:
    """A payload of megabytes goes to SQLite as the bytes `encode` built (a BLOB), not copied once
    more into a `str`; it reads back as the very body."""
    from journal.writer import STORED_AS_TEXT_BYTES

    body = '{"messages":[{"role":"user","content":"' + "é word " * (STORED_AS_TEXT_BYTES // 6) + '"}]}'
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    await writer.append("big", 1, Received(method="POST", path="/v1/messages", body=body, ts=1.0))
    await writer.append("small", 1, Received(method="POST", path="/v1/messages", body="{}", ts=1.0))
    for request_id in ("big", "small"):
        await writer.append(request_id, 2, Completed(status=200, duration_ms=1.0))
    await writer.close()
    with sqlite3.connect(path) as conn:
        stored = dict(
            conn.execute(
                "SELECT r.id, typeof(e.data) FROM events AS e JOIN requests AS r ON r.rk = e.rk"
                " WHERE e.kind = 'received'"
            ).fetchall()
        )
    assert stored == {"big": "blob", "small": "text"}
    with JournalReader(path) as reader:
        (_, received), _ = reader.events("big")
        assert isinstance(received, Received) and received.body == body


def test_a_long_text_is_encoded_without_a_buffer_for_the_whole_of_it() -> None:
    """One orjson call over a whole text reserves ~16 bytes per character (a 20 MiB body: 265 MB
    for a moment); window by window the peak is the payload and its pieces."""
    import tracemalloc

    from journal.writer import LONG_TEXT_CHARS, encode

    event = Received(method="POST", path="/v1/messages", body="word " * (2 * LONG_TEXT_CHARS // 5))
    tracemalloc.start()
    try:
        payload = encode(event)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(payload)


def test_a_run_is_put_together_in_one_copy() -> None:
    """`pack` joins its text section and entries at once: a relayed body of megabytes is not
    copied twice more to build its row."""
    import tracemalloc

    payload = b'{"part":"body","data":"' + b"x" * (4 << 20) + b'"}'
    event = Upstream(part="body", data="unused")
    tracemalloc.start()
    try:
        data = packed.pack([event], 0.0, lambda _: payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert data.startswith(payload + b"\x00")
    assert peak < 1.5 * len(payload)


async def _committed(writer: JournalWriter, events: int) -> None:
    """Wait until `events` events are committed, without `flush()` (which indexes)."""
    for _ in range(500):
        if writer.stats["events_written"] >= events:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{writer.stats['events_written']} of {events} events committed")


def _indexed(path: Path) -> tuple[int, int, int]:
    """(texts in the text index, texts staged, requests counted in the rollups)."""
    with sqlite3.connect(path) as conn:
        texts = conn.execute("SELECT count(*) FROM request_text").fetchone()[0]
        staged = conn.execute("SELECT count(*) FROM request_text_staged").fetchone()[0]
        counted = conn.execute("SELECT coalesce(max(requests), 0) FROM rollups").fetchone()[0]
    return texts, staged, counted


async def test_the_text_index_and_rollups_follow_the_commits_within_the_index_interval(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, index_interval_s=0.5)
    await writer.start()
    try:
        await writer.flush()  # the start's own indexing (nothing left by an earlier writer) is done
        events = streaming_request()
        for seq, event in enumerate(events):
            await writer.append("req_1", seq, event)
        await _committed(writer, len(events))
        assert _indexed(path) == (0, 1, 0)  # committed and staged, not indexed yet
        with JournalReader(path) as reader:
            assert reader.get_request("req_1") is not None  # the events and summary are there at once
        for _ in range(200):  # no further event comes: the idle writer's timer indexes
            if _indexed(path) == (1, 0, 1):
                break
            await asyncio.sleep(0.01)
        assert _indexed(path) == (1, 0, 1)
        with JournalReader(path) as reader:
            assert reader.count("zebra") == 0 and reader.count("unicode") == 1
    finally:
        await writer.close()


async def test_flush_brings_the_text_index_and_rollups_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, index_interval_s=3600.0)
    await writer.start()
    try:
        await writer.flush()
        for seq, event in enumerate(streaming_request()):
            await writer.append("req_1", seq, event)
        await writer.flush()
        assert _indexed(path) == (1, 0, 1)
    finally:
        await writer.close()


async def test_what_a_crash_left_staged_is_indexed_by_the_next_writer(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    events = streaming_request()
    first = JournalWriter(path, index_interval_s=3600.0)
    await first.start()
    await first.flush()
    for seq, event in enumerate(events):
        await first.append("req_1", seq, event)
    await _committed(first, len(events))
    # What a `kill -9` leaves: the file as committed, copied while the writer still has it open.
    crashed = tmp_path / "crashed.db"
    with sqlite3.connect(path) as source, sqlite3.connect(crashed) as target:
        source.backup(target)
    await first.close()
    assert _indexed(crashed) == (0, 1, 0)
    second = JournalWriter(crashed, index_interval_s=3600.0)
    await second.start()
    try:
        for _ in range(200):  # its first commit (here the index timer's) takes them
            if _indexed(crashed) == (1, 0, 1):
                break
            await asyncio.sleep(0.01)
        assert _indexed(crashed) == (1, 0, 1)
    finally:
        await second.close()


def test_the_index_interval_cannot_be_negative(tmp_path: Path) -> None:
    try:
        JournalWriter(tmp_path / "j.db", index_interval_s=-1.0)
    except ValueError:
        return
    raise AssertionError("a negative index interval was taken")


async def test_pruning_a_request_takes_its_staged_text_too(tmp_path: Path) -> None:
    from journal.retention import prune

    path = tmp_path / "j.db"
    writer = JournalWriter(path, index_interval_s=3600.0)
    await writer.start()
    try:
        events = streaming_request()
        for seq, event in enumerate(events):
            await writer.append("req_1", seq, event)
        await _committed(writer, len(events))
        assert _indexed(path)[1] == 1
        result = prune(path, max_age_s=60.0, now=events[0].ts + 3600.0)  # type: ignore[attr-defined]
        assert result.requests_deleted == 1
        assert _indexed(path) == (0, 0, 0)
        await writer.flush()  # nothing of it comes back into the index
        assert _indexed(path) == (0, 0, 0)
    finally:
        await writer.close()
