"""`journal.follow.Follower`: which requests completed since the last poll, on a real file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from journal import schema
from journal.follow import Follower
from journal.query import compile_query

T0 = 1_800_000_000.0


@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    return schema.connect(tmp_path / "j.db")


def arrive(db: sqlite3.Connection, request_id: str, ts: float, **columns: object) -> None:
    names = ["id", "ts", *columns]
    db.execute(
        f"INSERT INTO requests ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
        [request_id, ts, *columns.values()],
    )


def complete(db: sqlite3.Connection, request_id: str, status: int = 200) -> None:
    db.execute("UPDATE requests SET completed = 1, status = ? WHERE id = ?", (status, request_id))


def test_history_is_not_shown_but_requests_in_flight_are(db: sqlite3.Connection) -> None:
    arrive(db, "old-done", T0 - 100, completed=1, status=200)
    arrive(db, "old-open", T0 - 100)
    arrive(db, "just-done", T0 - 1, completed=1, status=200)  # inside the lag window
    follower = Follower(db, now=T0)
    assert follower.poll(now=T0) == [] and follower.in_flight == 1
    complete(db, "old-open")
    assert follower.poll(now=T0 + 1) == ["old-open"]
    assert follower.poll(now=T0 + 2) == [] and follower.in_flight == 0


def test_new_requests_show_once_when_they_complete(db: sqlite3.Connection) -> None:
    follower = Follower(db, now=T0)
    arrive(db, "a", T0 + 1, completed=1, status=200)
    arrive(db, "b", T0 + 2)
    assert follower.poll(now=T0 + 3) == ["a"]
    assert follower.poll(now=T0 + 4) == []
    complete(db, "b")
    arrive(db, "c", T0 + 5, completed=1, status=200)
    assert follower.poll(now=T0 + 6) == ["b", "c"]
    assert follower.poll(now=T0 + 7) == []


def test_a_row_committed_late_within_the_lag_is_not_missed(db: sqlite3.Connection) -> None:
    follower = Follower(db, now=T0, lag=5.0)
    arrive(db, "later", T0 + 3, completed=1, status=200)
    assert follower.poll(now=T0 + 4) == ["later"]
    arrive(db, "earlier", T0 + 2, completed=1, status=200)  # arrived first, committed after
    assert follower.poll(now=T0 + 5) == ["earlier"]


def test_the_query_is_applied_at_completion(db: sqlite3.Connection) -> None:
    where, params = compile_query("status:5xx")
    follower = Follower(db, where, params, now=T0)
    arrive(db, "fails", T0 + 1)  # no status yet: would not match on arrival
    arrive(db, "works", T0 + 1.5)
    assert follower.poll(now=T0 + 2) == []
    complete(db, "fails", 503)
    complete(db, "works", 200)
    assert follower.poll(now=T0 + 3) == ["fails"]


def test_requests_that_never_complete_are_given_up(db: sqlite3.Connection) -> None:
    follower = Follower(db, now=T0, horizon=60.0)
    arrive(db, "stuck", T0 + 1)
    follower.poll(now=T0 + 2)
    assert follower.in_flight == 1
    follower.poll(now=T0 + 100)
    assert follower.in_flight == 0


def test_many_requests_in_flight(db: sqlite3.Connection) -> None:
    follower = Follower(db, now=T0)
    for i in range(1200):  # more than one `IN (…)` chunk
        arrive(db, f"r{i:04}", T0 + 1 + i / 10_000)
    assert follower.poll(now=T0 + 2) == [] and follower.in_flight == 1200
    db.execute("UPDATE requests SET completed = 1, status = 200")
    assert follower.poll(now=T0 + 3) == [f"r{i:04}" for i in range(1200)]
