"""The shipper against a real PostgreSQL: a local journal of mixed traffic arrives whole and once,
survives re-sending and an outage, and local retention keeps what has not shipped."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import date
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from journal import packed
from journal import schema as local_schema
from journal.events import Completed, Received, Tokens, Upstream, Validated, event_from_dict
from journal.pg import outbox, schema
from journal.pg.shipper import Shipper
from journal.redact import SECRET_ENV, SECRET_FILE, redact_value
from journal.retention import prune
from journal.writer import JournalWriter, encode
from tests.fleet.conftest import until
from tools.build_journal import T0, Traffic, build, requests
from tools.servers.postgres import PostgresServer


def _start(started: list[Shipper], path: Path, url: str, replica: str, **kw: Any) -> Shipper:
    shipper = Shipper(path, url, replica, **kw)
    shipper.start()
    started.append(shipper)
    return shipper


async def _more(path: Path, traffic: Traffic, prefix: str) -> None:
    """More of `traffic`, its ids prefixed (so that they are new requests)."""
    writer = JournalWriter(path)
    await writer.start()
    try:
        for request_id, events in requests(traffic):
            for seq, event in enumerate(events, 1):
                await writer.append(prefix + request_id, seq, event)
    finally:
        await writer.close()


Contents = tuple[dict[str, tuple[Any, ...]], dict[str, list[tuple[Any, ...]]], dict[str, str]]
"""Summary rows, event rows and text of each request, by id."""


def _local(path: Path) -> Contents:
    conn = sqlite3.connect(path)
    cols = ", ".join(local_schema.REQUEST_COLUMNS)
    rows = {r[0]: r for r in conn.execute(f"SELECT {cols} FROM requests WHERE completed = 1")}
    events: dict[str, list[tuple[Any, ...]]] = {}
    for request_id, seq, kind, t, data in conn.execute(
        "SELECT r.id, e.seq, e.kind, e.t, e.data FROM events e JOIN requests r USING (rk)"
        " WHERE r.completed = 1 ORDER BY r.id, e.seq"
    ):
        events.setdefault(request_id, []).append((seq, kind, t, data.encode() if isinstance(data, str) else data))
    texts = dict(conn.execute("SELECT r.id, x.body FROM request_text x JOIN requests r ON r.rk = x.rowid"))
    conn.close()
    return rows, events, texts


def _fleet(url: str, replica: str) -> Contents:
    with psycopg.connect(url) as conn:
        cols = ", ".join(local_schema.REQUEST_COLUMNS)
        rows = {r[0]: r for r in conn.execute(f"SELECT {cols} FROM requests WHERE replica = %s", (replica,))}
        events: dict[str, list[tuple[Any, ...]]] = {}
        for request_id, seq, kind, t, data in conn.execute(
            "SELECT r.id, e.seq, e.kind, e.t, e.data FROM events e JOIN requests r USING (rk, day)"
            " WHERE r.replica = %s ORDER BY r.id, e.seq",
            (replica,),
        ):
            events.setdefault(request_id, []).append((seq, kind, t, bytes(data)))
        texts = dict(
            conn.execute(
                "SELECT r.id, x.body FROM request_text x JOIN requests r USING (rk, day) WHERE r.replica = %s",
                (replica,),
            ).fetchall()
        )
    return rows, events, texts


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT count(*) FROM requests").fetchone()
        assert found is not None
        return int(found[0])


async def test_a_journal_of_mixed_traffic_arrives_whole(tmp_path: Path, sink: str, started: list[Shipper]) -> None:
    path = tmp_path / "j.db"
    await build(path, Traffic(1500, span_s=2 * 86_400.0))  # two days: two partitions
    shipper = _start(started, path, sink, "web-1", batch_size=400)
    until(lambda: shipper.stats["requests_shipped"] >= 1500 and shipper.stats["unshipped"] == 0, what="shipping")
    local, fleet = _local(path), _fleet(sink, "web-1")
    assert len(local[0]) == 1500
    assert fleet[0] == local[0]  # every summary column, as stored
    assert fleet[1] == local[1]  # every event row, byte for byte (JSON and packed runs)
    assert fleet[2] == local[2]  # the text index's rows
    stats = shipper.stats
    assert stats["batches"] >= 4 and stats["duplicates"] == 0 and stats["failures"] == 0
    with psycopg.connect(sink) as conn:
        days = conn.execute("SELECT day, count(*) FROM requests GROUP BY day ORDER BY day").fetchall()
        assert len(days) == 3 and sum(n for _, n in days) == 1500  # T0 is mid-day: 3 UTC days
        assert conn.execute("SELECT name, requests FROM replicas").fetchall() == [("web-1", 1500)]


async def test_sending_again_inserts_nothing(tmp_path: Path, sink: str, started: list[Shipper]) -> None:
    path = tmp_path / "j.db"
    await build(path, Traffic(300))
    shipper = _start(started, path, sink, "web-1")
    until(lambda: shipper.stats["requests_shipped"] == 300, what="first shipping")
    shipper.stop()
    # What a crash between PostgreSQL's commit and the local cursor's leaves: all of it queued again.
    conn = local_schema.connect(path)
    conn.execute(f"INSERT INTO {outbox.TABLE} (rk, queued) SELECT rk, 0 FROM requests WHERE completed = 1")
    conn.close()
    again = _start(started, path, sink, "web-1")
    until(lambda: again.stats["duplicates"] == 300 and again.stats["unshipped"] == 0, what="second shipping")
    assert again.stats["requests_shipped"] == 0
    assert _count(sink) == 300
    with psycopg.connect(sink) as pg:
        rows = sum(len(v) for v in _local(path)[1].values())
        assert pg.execute("SELECT count(*) FROM events").fetchone() == (rows,)


async def test_an_outage_delays_shipping_and_loses_nothing(
    tmp_path: Path, own_postgres: PostgresServer, started: list[Shipper]
) -> None:
    url = own_postgres.url()
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn)
    path = tmp_path / "j.db"
    await build(path, Traffic(200, seed=1))
    shipper = _start(started, path, url, "web-1")
    until(lambda: shipper.stats["requests_shipped"] == 200, what="shipping before the outage")
    own_postgres.stop()
    await _more(path, Traffic(200, seed=2, start=T0 + 10), "b-")
    until(lambda: shipper.stats["failures"] >= 1, what="a failed attempt")
    until(lambda: shipper.stats["unshipped"] == 200, what="the backlog counted")
    assert shipper.stats["lag_seconds"] > 0
    own_postgres.start()
    until(lambda: shipper.stats["unshipped"] == 0 and shipper.stats["shipping"] == 1, what="draining")
    local = _local(path)
    assert len(local[0]) == 400
    assert _fleet(url, "web-1") == local
    assert shipper.stats["requests_shipped"] == 400 and shipper.stats["duplicates"] == 0


async def test_retention_keeps_what_has_not_shipped(tmp_path: Path, sink: str, started: list[Shipper]) -> None:
    path = tmp_path / "j.db"
    await build(path, Traffic(100))
    conn = local_schema.connect(path)
    assert outbox.install(conn) == 100
    conn.close()
    now = T0 + 30 * 86_400.0
    kept = prune(path, max_age_s=86_400.0, now=now)
    assert (kept.requests_deleted, kept.unshipped_kept) == (0, 100)
    shipper = _start(started, path, sink, "web-1")
    until(lambda: shipper.stats["unshipped"] == 0, what="shipping")
    shipper.stop()
    gone = prune(path, max_age_s=86_400.0, now=now)
    assert (gone.requests_deleted, gone.unshipped_kept) == (100, 0)
    assert _count(sink) == 100


async def test_a_file_that_no_longer_ships_is_left_as_without_a_sink(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await build(path, Traffic(20))
    conn = local_schema.connect(path)
    before = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert outbox.install(conn) == 20
    assert outbox.uninstall(conn) == 20
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master")} == before
    conn.close()


async def test_requests_postgresql_cannot_hold_do_not_stop_the_others(
    tmp_path: Path, sink: str, started: list[Shipper]
) -> None:
    path = tmp_path / "j.db"
    await build(path, Traffic(50))
    conn = local_schema.connect(path)
    outbox.install(conn)
    # An event number past 32 bits (binary COPY would wrap it: left out before sending), an event
    # kind PostgreSQL refuses (a NUL: the batch is refused, then sent one request at a time), and
    # an arrival no calendar day holds (filed as undated).
    for request_id, seq, kind in (("req_seq", 2**31, "completed"), ("req_nul", 2, "compl\x00eted")):
        rk = conn.execute(
            "INSERT INTO requests (id, ts, completed) VALUES (?, 1764504000, 1) RETURNING rk", (request_id,)
        ).fetchone()[0]
        conn.execute("INSERT INTO events (rk, seq, kind, t, data) VALUES (?, ?, ?, 0, '{}')", (rk, seq, kind))
    conn.execute("INSERT INTO requests (id, ts, completed) VALUES ('req_undated', 1e300, 1)")
    conn.close()
    shipper = _start(started, path, sink, "web-1", batch_size=20)
    until(lambda: shipper.stats["unshipped"] == 0 and shipper.stats["refused"] == 2, what="shipping")
    assert shipper.stats["requests_shipped"] == 51
    with psycopg.connect(sink) as pg:
        assert pg.execute("SELECT day FROM requests WHERE id = 'req_undated'").fetchone() == (date(1970, 1, 1),)
        assert pg.execute("SELECT count(*) FROM requests WHERE id IN ('req_seq', 'req_nul')").fetchone() == (0,)
        assert pg.execute("SELECT count(*) FROM events WHERE seq < 0").fetchone() == (0,)


async def test_a_request_closed_as_interrupted_then_completed_ships_again_and_both_journals_agree(
    tmp_path: Path, sink: str, started: list[Shipper]
) -> None:
    path = tmp_path / "j.db"
    live = JournalWriter(path)
    await live.start()
    recovering: JournalWriter | None = None
    try:
        now = time.time()
        await live.append("req-late", 1, Received(method="POST", path="/v1/messages", ts=now - 1, t=0.0))
        await live.append("req-late", 2, Tokens(ids=[1, 2], t=0.1))
        await live.flush()
        # The live writer's lock file lost (say, its directory removed by hand): the next
        # start's recovery takes its request in flight for a dead writer's.
        assert live._registration is not None
        live._registration.path.unlink()
        recovering = JournalWriter(path, recover=True)
        await recovering.start()
        await recovering.flush()
        shipper = _start(started, path, sink, "web-1")
        until(lambda: shipper.stats["requests_shipped"] == 1, what="the interrupted version shipped")
        assert _fleet(sink, "web-1")[0]["req-late"][9] == 0  # status: interrupted
        # Its real completion, written by the live writer afterwards.
        await live.append("req-late", 5, Completed(status=200, duration_ms=150.0, stop_reason="end_turn", t=0.15))
        await live.flush()
        local = _local(path)
        assert local[0]["req-late"][9] == 200
        until(lambda: _fleet(sink, "web-1") == local, what="the completed version shipped")
        until(lambda: shipper.stats["unshipped"] == 0, what="the queue drained")
        assert _count(sink) == 1
        with psycopg.connect(sink) as pg:
            assert pg.execute("SELECT requests FROM replicas").fetchone() == (1,)
    finally:
        await live.close()
        if recovering is not None:
            await recovering.close()


async def test_secrets_an_older_writer_left_in_clear_never_ship(
    tmp_path: Path, sink: str, started: list[Shipper]
) -> None:
    path = tmp_path / "j.db"
    secrets = ["AIzaCLEARgoog", "sk-ant-CLEAR", "pw-CLEAR", "tok-CLEAR", "mcp-CLEAR", "up-CLEAR"]
    headers = {"x-goog-api-key": secrets[0], "anthropic-api-key": secrets[1], "content-type": "application/json"}
    image = {
        "type": "image",
        "source": {"type": "url", "url": f"https://bob:{secrets[2]}@img.test/a.png?token={secrets[3]}"},
    }
    body = orjson.dumps({"messages": [{"role": "user", "content": [image]}]}).decode()
    received = Received(method="POST", path="/v1/messages", headers=headers, query=f"key={secrets[3]}", body=body)
    validated = Validated(
        model="m", summary={"mcp_servers": [{"url": "https://mcp.test", "authorization_token": secrets[4]}]}
    )
    head = Upstream(part="head", status=200, headers={"x-api-key": secrets[5]}, t=0.1)
    writer = JournalWriter(path)
    await writer.start()
    for seq, event in enumerate(
        [received, validated, head, Upstream(part="chunk", data="data: {}\n\n", t=0.2), Completed(200, 5.0, t=0.3)], 1
    ):
        await writer.append("old-1", seq, event)
    await writer.close()
    # What a writer from before redaction by rule stored: these secrets in clear.
    conn = local_schema.connect(path)
    for kind, event in (("received", received), ("validated", validated)):
        conn.execute("UPDATE events SET data = ? WHERE kind = ?", (encode(event).decode(), kind))
    ((t0, run),) = conn.execute("SELECT t, data FROM events WHERE kind = 'run'").fetchall()
    inner = [event_from_dict(k, p, t) for _, k, t, p in packed.unpack(3, t0, run)]
    inner[0] = head
    conn.execute("UPDATE events SET data = ? WHERE kind = 'run'", (packed.pack(inner, t0, encode),))
    stored = b"".join(d if isinstance(d, bytes) else d.encode() for (d,) in conn.execute("SELECT data FROM events"))
    assert all(s.encode() in stored for s in secrets)
    conn.close()
    shipper = _start(started, path, sink, "web-1")
    until(lambda: shipper.stats["requests_shipped"] == 1, what="shipping")
    fleet = _fleet(sink, "web-1")[1]["old-1"]
    shipped = b"".join(row[3] for row in fleet)
    assert not [s for s in secrets if s.encode() in shipped]
    assert [row[1] for row in fleet] == ["received", "validated", "run", "completed"]
    assert packed.unpack(3, fleet[2][2], fleet[2][3])[1][3]["data"] == "data: {}\n\n"  # the rest as it was
    assert orjson.loads(fleet[0][3])["headers"]["content-type"] == "application/json"


async def test_old_secrets_ship_with_the_journals_keyed_fingerprints(
    tmp_path: Path, sink: str, started: list[Shipper], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "j.db"
    key = b"k" * 32
    (tmp_path / SECRET_FILE).write_bytes(key)  # as the gateway writing the journal made it
    goog, mcp, head_key = "AIzaCLEARgoog", "mcp-CLEAR", "up-CLEAR"
    received = Received(method="POST", path="/v1/messages", headers={"x-goog-api-key": goog}, body="{}")
    validated = Validated(model="m", summary={"mcp_servers": [{"url": "https://mcp.test", "authorization_token": mcp}]})
    head = Upstream(part="head", status=200, headers={"x-api-key": head_key}, t=0.1)
    writer = JournalWriter(path, secret=key)
    await writer.start()
    for seq, event in enumerate(
        [received, validated, head, Upstream(part="chunk", data="data: {}\n\n", t=0.2), Completed(200, 5.0, t=0.3)], 1
    ):
        await writer.append("old-1", seq, event)
    await writer.close()
    # What a writer from before redaction by rule stored: these secrets in clear.
    conn = local_schema.connect(path)
    for kind, event in (("received", received), ("validated", validated)):
        conn.execute("UPDATE events SET data = ? WHERE kind = ?", (encode(event).decode(), kind))
    ((t0, run),) = conn.execute("SELECT t, data FROM events WHERE kind = 'run'").fetchall()
    inner = [event_from_dict(k, p, t) for _, k, t, p in packed.unpack(3, t0, run)]
    inner[0] = head
    conn.execute("UPDATE events SET data = ? WHERE kind = 'run'", (packed.pack(inner, t0, encode),))
    conn.close()
    shipper = _start(started, path, sink, "web-1")
    until(lambda: shipper.stats["requests_shipped"] == 1, what="shipping")
    fleet = _fleet(sink, "web-1")[1]["old-1"]
    assert orjson.loads(fleet[0][3])["headers"]["x-goog-api-key"] == redact_value(goog, key)
    summary = orjson.loads(fleet[1][3])["summary"]
    assert summary["mcp_servers"][0]["authorization_token"] == redact_value(mcp, key)
    shipped_head = packed.unpack(3, fleet[2][2], fleet[2][3])[0][3]
    assert shipped_head["headers"]["x-api-key"] == redact_value(head_key, key)


async def test_a_large_body_stored_as_bytes_ships_byte_for_byte(
    tmp_path: Path, sink: str, started: list[Shipper]
) -> None:
    """A payload over `STORED_AS_TEXT_BYTES` is a BLOB in the local file; it ships as it is stored."""
    from journal.writer import STORED_AS_TEXT_BYTES

    path = tmp_path / "j.db"
    body = '{"messages":[{"role":"user","content":"' + "é word " * (STORED_AS_TEXT_BYTES // 6) + '"}]}'
    writer = JournalWriter(path)
    await writer.start()
    events = [Received(method="POST", path="/v1/messages", body=body, ts=T0), Completed(status=200, duration_ms=1.0)]
    for seq, event in enumerate(events, 1):
        await writer.append("big", seq, event)
    await writer.close()
    shipper = _start(started, path, sink, "web-1")
    until(lambda: shipper.stats["requests_shipped"] >= 1 and shipper.stats["unshipped"] == 0, what="shipping")
    local, fleet = _local(path), _fleet(sink, "web-1")
    assert fleet[1] == local[1] and fleet[0] == local[0]
    (_, kind, _, data), _ = fleet[1]["big"]
    assert kind == "received" and orjson.loads(data)["body"] == body


async def test_a_request_shipped_before_its_text_is_indexed_ships_its_text(
    tmp_path: Path, sink: str, started: list[Shipper]
) -> None:
    # The writer indexes texts about once a second: a request can complete and ship in between.
    path = tmp_path / "j.db"
    writer = JournalWriter(path, index_interval_s=3600.0)
    await writer.start()
    try:
        traffic = list(requests(Traffic(20)))
        for request_id, events in traffic:
            for seq, event in enumerate(events, 1):
                await writer.append(request_id, seq, event)
        total = sum(len(events) for _, events in traffic)
        for _ in range(1000):  # committed (not `flush()`ed: that would index)
            if writer.stats["events_written"] >= total:
                break
            await asyncio.sleep(0.01)
        with sqlite3.connect(path) as conn:
            staged = conn.execute("SELECT count(*) FROM request_text_staged").fetchone()[0]
            completed = conn.execute("SELECT count(*) FROM requests WHERE completed = 1").fetchone()[0]
        assert staged > 0 and not _local(path)[2]  # committed, none indexed yet
        shipper = _start(started, path, sink, "web-1")
        until(
            lambda: shipper.stats["requests_shipped"] >= completed and shipper.stats["unshipped"] == 0,
            what="shipping",
        )
    finally:
        await writer.close()  # indexes what was staged
    local, fleet = _local(path), _fleet(sink, "web-1")
    assert len(local[2]) == staged and fleet[2] == local[2]
