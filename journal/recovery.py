"""Requests left in flight by a gateway that died: found at the next start and closed as
`interrupted`.

Which writers are alive is known by lock files: every writer holds an exclusive `flock` on a
file of its own in `.<journal name>.writers/` beside it for as long as its process lives (the kernel releases
it when the process dies, however it dies), and the file holds the time it started. A request
in flight can belong to a live writer only if it arrived after that writer started, so the
requests in flight that arrived before the earliest start of every live writer (this one
included) belong to no one and never complete: each gets an `error` and a `completed` event,
status 0 and code `interrupted`. A dead writer's requests that arrived after a live writer
started are left for a later start (they cannot be told apart from that writer's own). Only
one process runs this (the first of `--workers N`); the others only register.

A live writer that had to drop a request's `completed` event (its commits failing or stalled
with the held buffer full) closes that request itself once its commits have caught up
(`dropped`, code `journal_events_dropped`), so no request stays in flight for a drop either.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import sqlite3
import time
from pathlib import Path

from journal.events import Completed, Error, Event

INTERRUPTED = "interrupted"
STATUS = 0  # no HTTP status reached the client
MESSAGE = "the gateway stopped (a crash or a kill) before the request completed; closed at its next start"
DROPPED = "journal_events_dropped"
DROPPED_MESSAGE = (
    "the journal dropped this request's completion while its commits were failing or stalled; closed once they resumed"
)


class RegistrationError(OSError):
    """This process cannot register as a live writer: it must not write the journal, since
    another process's recovery would take its requests in flight for a dead writer's."""


class Registration:
    """This process's lock file among the journal's writers (kept locked until `close`).
    Raises `RegistrationError` when it cannot be made."""

    def __init__(self, journal: str | os.PathLike[str]) -> None:
        where = Path(journal)
        self.directory = where.parent / f".{where.name}.writers"
        self.started = time.time()
        self.path = self.directory / f"{os.getpid()}-{secrets.token_hex(4)}"
        try:
            self.directory.mkdir(exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise RegistrationError(f"cannot register as a live writer in {self.directory}: {exc}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            os.write(self._fd, repr(self.started).encode())
        except OSError as exc:
            os.close(self._fd)
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise RegistrationError(f"cannot register as a live writer in {self.directory}: {exc}") from None

    def earliest_live_start(self) -> float:
        """The earliest start among the live writers (this one included); the files of dead
        writers are removed on the way."""
        earliest = self.started
        for other in self.directory.iterdir():
            if other == self.path:
                continue
            try:
                fd = os.open(other, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # held: its writer is alive
                    with contextlib.suppress(ValueError):
                        earliest = min(earliest, float(os.read(fd, 64).decode() or earliest))
                    continue
                other.unlink(missing_ok=True)  # free: its writer is gone
            finally:
                os.close(fd)
        return earliest

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)


def orphans(conn: sqlite3.Connection, before: float) -> list[tuple[str, int, list[Event]]]:
    """The events that close each request in flight that arrived before `before`: (request
    id, first seq, events)."""
    rows = conn.execute(
        "SELECT r.id, max(e.seq), max(e.t), r.ts FROM requests AS r JOIN events AS e ON e.rk = r.rk"
        " WHERE r.completed = 0 AND r.ts < ? GROUP BY r.rk",
        (before,),
    ).fetchall()
    out: list[tuple[str, int, list[Event]]] = []
    for request_id, seq, last_t, _ts in rows:
        t = float(last_t or 0.0)
        error = Error(stage="gateway", status=STATUS, error_type="api_error", message=MESSAGE, code=INTERRUPTED, t=t)
        completed = Completed(status=STATUS, duration_ms=round(t * 1000, 3), t=t)
        out.append((request_id, int(seq) + 1, [error, completed]))
    return out


def dropped(conn: sqlite3.Connection, completions: dict[str, tuple[int, float]]) -> list[tuple[str, int, list[Event]]]:
    """The events that close each request of `completions` (request id: the seq and time of
    its `completed` event, which the writer dropped) that is stored and still in flight: an
    `error` (code `journal_events_dropped`) and a `completed` in the dropped event's place.
    Requests none of whose events were stored stay absent."""
    ids = list(completions)
    found: set[str] = set()
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        sql = f"SELECT id FROM requests WHERE completed = 0 AND id IN ({marks})"
        found.update(row[0] for row in conn.execute(sql, chunk))
    out: list[tuple[str, int, list[Event]]] = []
    for request_id in ids:
        if request_id not in found:
            continue
        seq, t = completions[request_id]
        error = Error(
            stage="journal", status=STATUS, error_type="api_error", message=DROPPED_MESSAGE, code=DROPPED, t=t
        )
        out.append((request_id, seq, [error, Completed(status=STATUS, duration_ms=round(t * 1000, 3), t=t)]))
    return out
