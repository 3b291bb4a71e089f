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
