"""Which journal a read command opens: a SQLite file, or the fleet journal in PostgreSQL.

`smg journal …`, `smg replay` and `smg inspect` take `--journal` as a file path or as a
`postgresql://` (or `postgres://`) URL. `open_journal` returns the matching reader; both
implement `JournalStore`, the read side every command uses, so a command is written once for
both stores: the same query language (`journal.query`, compiled for the store), the same rows,
the same statistics (`journal.stats`/`journal.groups` computing from the rows either store reads).

Rows carry one key beyond `journal.schema.REQUEST_COLUMNS`: `replica`, the name of the gateway
replica that served the request (`--replica-name`). A SQLite file is one gateway's own journal
and records no name: its rows have `replica: None`, and a `replica:` term matches none of them
(a term on a column a request has no value for is false; `!replica:NAME` matches them all).

psycopg is imported only when a URL names PostgreSQL: a file's readers never load it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

from journal.events import Event

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
REPLICA = "replica"
"""The row key (and the query field) naming the replica a request came from."""


def is_postgres(target: str | os.PathLike[str]) -> bool:
    """Whether `--journal` names the fleet journal in PostgreSQL rather than a file."""
    return isinstance(target, str) and target.lower().startswith(POSTGRES_SCHEMES)


class Following(Protocol):
    """What `smg journal tail` polls: ids of the matching requests completed since the last look."""

    def poll(self, now: float | None = None) -> list[str]: ...


class JournalStore(Protocol):
    """The read side of a journal, whichever store holds it (see the module docstring).

    Queries are in the language of `journal.query`; a bad one raises `journal.query.QueryError`.
    A store that cannot be read raises `journal.reader.JournalError`.
    """

    @property
    def location(self) -> str:
        """Where the journal is, as said in messages (a path, or a URL without its password)."""
        ...

    def check(self, query: str) -> None:
        """Raise `QueryError` when `query` does not compile for this store."""

    def count(self, query: str = "") -> int: ...

    def list_requests(
        self,
        limit: int = 50,
        *,
        query: str = "",
        offset: int = 0,
        order: str = "ts",
        descending: bool = True,
        since_ts: float | None = None,
        newest_first: bool | None = None,
    ) -> list[dict[str, Any]]: ...

    def list_after(self, limit: int, *, query: str = "", after: int = 0) -> list[tuple[int, dict[str, Any]]]: ...

    def page(
        self, limit: int = 50, *, query: str = "", offset: int = 0, **options: Any
    ) -> tuple[list[dict[str, Any]], int]: ...

    def get_request(self, id_or_prefix: str) -> dict[str, Any] | None: ...

    def resolve(self, request_id: str) -> str: ...

    def raw_events(self, request_id: str) -> list[tuple[int, str, float, dict[str, Any]]]: ...

    def events(self, request_id: str) -> list[tuple[int, Event]]: ...

    def stats(self, query: str = "") -> dict[str, Any]:
        """`journal.stats.compute` of the requests `query` selects."""
        ...

    def group_stats(self, query: str = "", *, by: str | None = None, every: int | None = None) -> list[dict[str, Any]]:
        """`journal.groups.compute` of the requests `query` selects."""
        ...

    def thread_ids(self, thread_key: str, limit: int) -> list[str]:
        """The ids of the requests with this conversation key, oldest first."""
        ...

    def follower(self, query: str = "") -> Following:
        """What `tail` polls for `query`: a file's `journal.follow.Follower`, the fleet
        journal's `journal.pg.read.PgFollower` (by arrival in PostgreSQL)."""
        ...

    def interrupt(self) -> None:
        """Stop the query running on this store (from another thread); it raises `JournalError`."""

    def close(self) -> None: ...

    def __enter__(self) -> JournalStore: ...

    def __exit__(self, *exc: object) -> None: ...


def open_journal(target: str | os.PathLike[str]) -> JournalStore:
    """The reader of `target`: a `postgresql://` URL's fleet journal, else the SQLite file at that path.

    Raises `journal.reader.JournalNotFound`/`JournalError` as the reader does.
    """
    if is_postgres(target):
        from journal.pg.read import PostgresReader

        return PostgresReader(str(target))
    from journal.reader import JournalReader

    return JournalReader(target)


def with_replica(rows: Sequence[dict[str, Any]], replica: str | None = None) -> list[dict[str, Any]]:
    """`rows` with the `replica` key (a file's rows: None)."""
    for row in rows:
        row.setdefault(REPLICA, replica)
    return list(rows)


def shown(target: str | os.PathLike[str]) -> str:
    """`target` as messages say it: a URL without its password."""
    text = os.fspath(target)
    if not is_postgres(text):
        return text
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(text)
    if parts.password is None:
        return text
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" if parts.username else f"***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
