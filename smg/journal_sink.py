"""`--journal-sink postgresql://…` and `--replica-name`: shipping this replica's journal to the fleet's.

The settings, the start-up check and the shipper's life in one gateway process. The local
journal stays what it is (the durable buffer, written as without a sink); a shipper thread
(`journal.pg.shipper`) sends the completed requests to PostgreSQL. At start, before serving,
`prepare` connects once and checks the schema: a URL that is not PostgreSQL's, a server that
does not answer, credentials it refuses, a database without the smg schema (create it with
`smg journal-sink init URL`) or with a newer one is a `SinkError` (one line; `smg launch`
exits 2), never a gateway that serves and ships nothing. An older smg schema is migrated then.
A gateway started without a sink on a file that used to ship stops queueing (saying how many
requests were left unshipped), so that its file is kept as a single gateway's, unless another
live gateway ships from that file (it holds the file's ship lock): then the queue stays.

With `--workers N` every process runs a shipper on the one shared file; one ships at a time
(the holder of the file's ship lock), the others stand by and take over if it dies.
"""

from __future__ import annotations

import logging
import socket
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smg.flags import option

log = logging.getLogger(__name__)


class SinkError(ValueError):
    """The sink cannot be used as given (the message is one line, the password left out)."""


@dataclass(frozen=True)
class SinkConfig:
    """`--journal-sink`, `--replica-name`."""

    url: str | None = field(
        default=None,
        metadata=option(
            "--journal-sink",
            "Ship completed requests to this fleet journal (postgresql://user:password@host:port/db);"
            " the local journal stays the buffer.",
        ),
    )
    replica_name: str | None = field(
        default=None,
        metadata=option(
            "--replica-name", "This replica's name in the fleet journal (default: this host's name and --port)."
        ),
    )

    def replica(self, port: int) -> str:
        return self.replica_name or f"{socket.gethostname()}:{port}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def prepare(sink: SinkConfig, journal_path: Path | None) -> None:
    """The start-up check (see the module docstring); raises SinkError."""
    if sink.url is None:
        if journal_path is not None and journal_path.is_file():
            _stop_queueing(journal_path)
        return
    if sink.replica_name is not None and not sink.replica_name.strip():
        raise SinkError("--replica-name must not be empty")
    if journal_path is None:
        raise SinkError("--journal-sink ships the local journal, which --no-journal turns off")
    import psycopg

    from journal.pg import schema
    from journal.pg.shipper import connect, display

    if not sink.url.startswith(("postgresql://", "postgres://")):
        raise SinkError(f"--journal-sink must be a postgresql:// URL, got {sink.url.split('://')[0]!r}://…")
    where = display(sink.url)
    try:
        with connect(sink.url) as conn:
            version = schema.version(conn)
            if version == 0:
                raise SinkError(
                    f"--journal-sink {where}: the database has no smg journal schema;"
                    f" create it with `smg journal-sink init {where}`"
                )
            if version < schema.SCHEMA_VERSION:
                log.info("journal sink: migrating %s from schema version %d", where, version)
                schema.migrate(conn)
            schema.check(conn)
    except SinkError:
        raise
    except schema.SchemaTooNew as exc:
        raise SinkError(f"--journal-sink {where}: {exc}; upgrade this gateway") from None
    except psycopg.Error as exc:
        raise SinkError(f"--journal-sink {where}: {_first_line(exc)}") from None


def _stop_queueing(journal_path: Path) -> None:
    from journal.pg import outbox

    # A plain connection: the writer migrates the file, and reports what it cannot open, as without a sink.
    try:
        conn = sqlite3.connect(journal_path, isolation_level=None)
    except sqlite3.Error:
        return
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        if not outbox.installed(conn):
            return
        with outbox.ship_lock(journal_path) as held:
            if not held:  # another live gateway ships from this file: its queue stays
                log.info("journal sink: %s is shipped by another gateway; its queue is kept", journal_path)
                return
            left = outbox.uninstall(conn)
        log.warning(
            "journal sink: %s no longer ships (no --journal-sink); %d completed requests were never shipped",
            journal_path,
            left,
        )
    finally:
        conn.close()


def start(sink: SinkConfig, journal_path: Path | None, port: int, max_age_s: float | None) -> Any:
    """The running shipper (a `journal.pg.shipper.Shipper`), or None without a sink."""
    if sink.url is None or journal_path is None:
        return None
    from journal.pg.shipper import Shipper

    shipper = Shipper(journal_path, sink.url, sink.replica(port), max_age_s=max_age_s)
    shipper.start()
    log.info("journal sink: shipping %s to %s as %s", journal_path, _display(sink.url), shipper.replica)
    return shipper


def _display(url: str) -> str:
    from journal.pg.shipper import display

    return display(url)
