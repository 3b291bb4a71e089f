"""The shipper: a thread that sends a replica's completed requests from its local journal to PostgreSQL.

Nothing on the request path waits for it: the journal writer commits to the local file as it
always does (the durable buffer), the file's triggers queue each request as it completes
(`journal.pg.outbox`), and this thread, on connections of its own, reads the queue oldest
first, ships up to `batch_size` requests per PostgreSQL transaction (`journal.pg.ship`) and
then removes them from the queue. When PostgreSQL is down or refuses, the requests stay queued
and the thread retries (0.5 s, doubling to 5 s): one log line when shipping stops, one when it
resumes, and `failures` counts the attempts. A crash at any point loses nothing (the queue is
in the committed local file) and ships nothing twice (PostgreSQL ignores a request it has).

With several gateway processes on one file (`--workers N`) exactly one ships: the one holding
an exclusive lock on `<journal>.ship.lock` (released by the kernel when its holder dies, and
then taken by another within a second). The others stand by; each reports the backlog.

While one batch ships (in a thread of its own, mostly waiting on PostgreSQL), the next is read
from the local file and made ready, so that the two overlap.

A request PostgreSQL refuses on its own (a value it cannot hold that `ship` does not mend) is
logged with its id, counted in `refused` and taken off the queue, so that one bad row cannot
stop a replica's shipping for good; it stays in the local journal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from journal import schema as local_schema
from journal.pg import outbox, partitions, schema, ship
from journal.pg.pacing import Pacing
from journal.redact import read_secret

log = logging.getLogger(__name__)

_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 5.0
_BACKLOG_EVERY_S = 1.0
_DRAIN_S = 3.0  # at shutdown, how long the shipper goes on sending what is queued


def display(url: str) -> str:
    """`url` without its password, for logs and errors."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<an unparsable PostgreSQL URL>"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host', '')}{port}/{info.get('dbname', '')}"


def connect(url: str, *, timeout: float = 5.0) -> psycopg.Connection[Any]:
    """A connection for shipping: autocommit (`ship.write` opens its own transaction)."""
    return psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout)), application_name="smg-shipper")


class Shipper:
    """Ships the local journal at `journal_path` to the PostgreSQL at `url` as `replica`."""

    def __init__(
        self,
        journal_path: str | os.PathLike[str],
        url: str,
        replica: str,
        *,
        batch_size: int = 2000,
        idle_s: float = 0.1,
        max_age_s: float | None = None,
    ) -> None:
        self.path = os.fspath(journal_path)
        self.url = url
        self.replica = replica
        self.batch_size = batch_size
        self.idle_s = idle_s
        self.max_age_s = max_age_s  # the local retention's age: unshipped requests past it are reported
        self._secret = read_secret(self.path)  # old secrets are fingerprinted as the journal's writer keys them
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_file: int | None = None
        self._pg: psycopg.Connection[Any] | None = None
        self._days: set[date] = set()
        self._pacing = Pacing(_RETRY_FIRST_S, _RETRY_MAX_S, _DRAIN_S)
        self._backlog_at = 0.0
        self._pinged = 0.0
        self._stats: dict[str, float] = {
            "shipping": 0,
            "unshipped": 0,
            "lag_seconds": 0.0,
            "batches": 0,
            "requests_shipped": 0,
            "events_shipped": 0,
            "duplicates": 0,
            "failures": 0,
            "refused": 0,
            "past_retention": 0,
        }

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Queue the file's completed requests (first time only) and start the thread."""
        conn = local_schema.connect(self.path)
        try:
            queued = outbox.install(conn)
        finally:
            conn.close()
        if queued:
            log.info("journal sink: %d requests already in %s will ship to %s", queued, self.path, display(self.url))
        self._thread = threading.Thread(target=self._run, name=f"journal-sink:{self.replica}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = _DRAIN_S + 5.0) -> None:
        """Ship what is queued for a few seconds more (if PostgreSQL answers), then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        local = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        local.execute("PRAGMA busy_timeout=5000")
        # One batch ships (in `writer`) while the next is read from the local file and made ready here.
        writer = ThreadPoolExecutor(1, thread_name_prefix=f"journal-sink-write:{self.replica}")
        inflight: tuple[Future[ship.Shipped], ship.Rows] | None = None
        pacing = self._pacing
        try:
            while True:
                if self._stop.is_set():
                    pacing.stop(time.monotonic())
                late = pacing.late(time.monotonic())
                if late and inflight is None:
                    return
                self._refresh_backlog(local)
                if not self._holds_lock():
                    if self._stop.wait(1.0):
                        return
                    continue
                try:
                    after = inflight[1].keys[-1] if inflight is not None else None
                    keys = [] if late else outbox.next_keys(local, self.batch_size, after)
                    ready = ship.rows(outbox.read(local, keys), self._secret) if keys else None
                    if inflight is not None:
                        future, sent = inflight
                        inflight = None
                        self._shipped(local, sent, future.result())
                    if ready is None:
                        self._touch(idle=True)  # nothing to send: still say whether PostgreSQL answers
                except Exception as exc:
                    # What was read ahead is read again from the queue; a batch still in flight
                    # (the local file failed) is collected on the next round.
                    wait = self._failed(exc)
                    if pacing.stopping or self._stop.wait(wait):
                        return
                    continue
                if ready is not None:
                    inflight = (writer.submit(self._write, ready), ready)
                    continue
                if pacing.stopping:
                    return  # everything queued has shipped
                self._stop.wait(self.idle_s)
        except Exception:
            log.exception("journal sink: the shipper stopped; requests stay queued in %s", self.path)
        finally:
            if inflight is not None:
                with contextlib.suppress(Exception):
                    self._shipped(local, inflight[1], inflight[0].result())
            writer.shutdown(wait=True)
            self._refresh_backlog(local, force=True)
            self._stats["shipping"] = 0
            local.close()
            if self._pg is not None:
                self._pg.close()
            if self._lock_file is not None:
                os.close(self._lock_file)  # releases the lock

    def _holds_lock(self) -> bool:
        if self._lock_file is not None:
            return True
        fd = outbox.try_ship_lock(self.path)
        if fd is None:
            return False
        try:
            # A gateway without a sink may have removed the queue between `start` and now (it
            # does only while nobody holds the lock): the holder makes sure the file ships.
            conn = local_schema.connect(self.path)
            try:
                outbox.install(conn)
            finally:
                conn.close()
        except BaseException:
            os.close(fd)
            raise
        self._lock_file = fd
        return True

    def _connection(self) -> psycopg.Connection[Any]:
        if self._pg is not None and not self._pg.closed:
            return self._pg
        conn = connect(self.url)
        try:
            schema.check(conn)
            ship.prepare(conn)
            self._days = set(partitions.days(conn))
        except BaseException:
            conn.close()
            raise
        self._pg = conn
        return conn

    def _touch(self, *, idle: bool = False) -> psycopg.Connection[Any]:
        """The connection, with the days ahead created (raises when PostgreSQL does not answer).
        `idle`: nothing is being sent, so ask the server once a second whether it is there."""
        pg = self._connection()
        if idle and time.monotonic() - self._pinged >= _BACKLOG_EVERY_S:
            pg.execute("SELECT 1")
            self._pinged = time.monotonic()
        ahead = [d for d in partitions.ahead() if d not in self._days]
        if ahead:
            partitions.ensure(pg, ahead)
            self._days.update(ahead)
        self._recovered()
        self._stats["shipping"] = 1
        return pg

    def _write(self, batch: ship.Rows) -> ship.Shipped:
        """One batch into PostgreSQL (in the writer thread)."""
        pg = self._touch()
        needed = batch.days - self._days
        if needed:
            partitions.ensure(pg, needed)
            self._days.update(needed)
        try:
            return ship.write(pg, self.replica, batch)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise
        except psycopg.DatabaseError as exc:
            return self._one_by_one(pg, batch, exc)

    def _shipped(self, local: sqlite3.Connection, batch: ship.Rows, shipped: ship.Shipped) -> None:
        outbox.done(local, batch.queued)
        stats = self._stats
        for request_id in batch.refused:
            stats["refused"] += 1
            log.error("journal sink: request %s holds an event PostgreSQL cannot hold; not shipped", request_id)
        stats["batches"] += 1
        stats["requests_shipped"] += shipped.requests
        stats["events_shipped"] += shipped.events
        stats["duplicates"] += shipped.duplicates
        self._refresh_backlog(local, force=True)

    def _one_by_one(self, pg: psycopg.Connection[Any], batch: ship.Rows, first: Exception) -> ship.Shipped:
        """A batch PostgreSQL refused: each request alone, the ones refused alone logged and left out."""
        log.warning("journal sink: a batch was refused (%s); shipping it one request at a time", first)
        requests = events = duplicates = updated = 0
        for row in batch.requests:
            rk = row[1]
            single = ship.Rows(
                [rk], [row], [e for e in batch.events if e[0] == rk], [t for t in batch.texts if t[0] == rk]
            )
            try:
                shipped = ship.write(pg, self.replica, single)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                raise
            except psycopg.DatabaseError as exc:
                self._stats["refused"] += 1
                log.error("journal sink: request %s refused by PostgreSQL, not shipped: %s", row[2], exc)
                continue
            requests += shipped.requests
            events += shipped.events
            duplicates += shipped.duplicates
            updated += shipped.updated
        return ship.Shipped(requests, events, duplicates, updated)

    def _refresh_backlog(self, local: sqlite3.Connection, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._backlog_at < _BACKLOG_EVERY_S:
            return
        self._backlog_at = now
        try:
            count, oldest = outbox.backlog(local)
            past = 0
            if self.max_age_s is not None and count:
                past = local.execute(
                    f"SELECT count(*) FROM {outbox.TABLE} q JOIN requests r ON r.rk = q.rk WHERE r.ts < ?",
                    (time.time() - self.max_age_s,),
                ).fetchone()[0]
        except sqlite3.Error:
            return
        self._stats["unshipped"] = count
        self._stats["lag_seconds"] = max(0.0, time.time() - oldest) if oldest is not None else 0.0
        self._stats["past_retention"] = past

    def _failed(self, exc: Exception) -> float:
        """Count a failed attempt and say so once per incident; the seconds to wait."""
        self._stats["failures"] += 1
        self._stats["shipping"] = 0
        if isinstance(exc, psycopg.Error):
            if self._pg is not None:  # nothing is in flight: the error came from collecting it, or from idle
                self._pg.close()
                self._pg = None
        starts, wait = self._pacing.failed(time.monotonic())
        if starts:
            if not isinstance(exc, psycopg.Error):
                log.exception("journal sink: shipping from %s failed", self.path)
            log.error(
                "journal sink: cannot ship to %s (%s); serving continues, completed requests stay queued in %s"
                " and are retried",
                display(self.url),
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                self.path,
            )
        return wait

    def _recovered(self) -> None:
        lasted = self._pacing.answered(time.monotonic())
        if lasted is not None:
            log.warning(
                "journal sink: shipping to %s resumed after %.1fs (%d requests waiting)",
                display(self.url),
                lasted,
                self._stats["unshipped"],
            )
