"""Query, stats and prune timings on a large journal (README, "Search at scale").

    python -m tools.build_journal j1m.db --requests 1000000
    python -m tools.bench.journal_scale j1m.db [--prune] [--reps 3] [--json PATH]
    python -m tools.bench.journal_scale j1m.db --postgres [URL] [--ship]

Each query is timed as `smg journal ls` runs it (the first page of 50 newest first, and the
count), each `stats` as the command computes it, through a reader opened for the
measurement. Cold: the file's pages are dropped from the OS page cache first
(`posix_fadvise(DONTNEED)`, which needs no privileges) and the reader is new, so every page
is read from the disk; warm: the median of `--reps` more runs right after. `--prune` then
prunes a copy of the file (next to it) down to 90% of its data (`prune --max-size`) while
another connection takes the write lock every 20 ms, as a gateway's writer would, and reports
the longest it had to wait.

`--postgres` times the same queries on the fleet journal (`journal.pg.read`): at URL, or
without one in a PostgreSQL the bench starts in a temp dir (`tools.servers.postgres`);
`--ship` (implied without a URL) first ships the file there with the gateway's shipper and
prints its rate. Cold there is the first run on a new connection (PostgreSQL's buffers and the
OS cache are not dropped: cold only as far as a new session is); warm, the median after it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics as stats_mod
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from journal import schema
from journal.reader import JournalReader
from journal.retention import prune, used_bytes
from journal.store import JournalStore, open_journal

# The rows of the README table, in its order; `{trace}` and `{key}` are filled from the file.
QUERIES: tuple[tuple[str, str], ...] = (
    ("fields", "session:session-17"),
    ("fields", "user:user-7"),
    ("fields", "trace:{trace}"),
    ("fields", "key:{key}"),
    ("fields", "hung_up:yes"),
    ("fields", "cut:yes"),
    ("fields", "session:session-17 model:qwen3-8b"),
    ("filters", "model:qwen3-8b status:529"),
    ("filters", "status:5xx"),
    ("filters", "has:error model:claude-*"),
    ("filters", "dur:>2s"),
    ("filters", "ttft:<25ms"),
    ("filters", "stop:end_turn stream:yes"),
    ("filters", "worker:*10.0.0.3*"),
    ("filters", "id:req_0000"),
    ("filters", "!model:qwen3-8b"),
    ("text", '"zulu yankee xray"'),
    ("text", "alpha"),
    ("text", "!alpha"),
    ("text", "alpha !bravo"),
    ("text", "overloaded | timeout"),
)
STATS: tuple[tuple[str, str, str | None, int | None], ...] = (
    ("stats", "", None, None),
    ("stats model:qwen3-8b", "model:qwen3-8b", None, None),
    ("stats has:error", "has:error", None, None),
    ("stats --by model --every 1h", "", "model", 3600),
    ("stats --by key", "", "key", None),
)


def drop_cache(path: Path) -> None:
    """Evict the journal's pages (and its WAL's) from the OS page cache."""
    for name in (path, Path(f"{path}-wal")):
        if name.exists():
            fd = os.open(name, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(path: Path | str, run: Callable[[JournalStore], Any], reps: int) -> dict[str, Any]:
    """Cold (a new reader, the file out of the page cache) and warm (median of `reps`) seconds."""
    if isinstance(path, Path):
        drop_cache(path)
    with open_journal(path) as reader:
        started = time.perf_counter()
        result = run(reader)
        cold = time.perf_counter() - started
        warm = []
        for _ in range(reps):
            started = time.perf_counter()
            run(reader)
            warm.append(time.perf_counter() - started)
    return {"cold_s": cold, "warm_s": stats_mod.median(warm), "result": result}


def _page(query: str) -> Callable[[JournalStore], Any]:
    def run(reader: JournalStore) -> Any:
        rows, total = reader.page(50, query=query)
        return total

    return run


def _stats(query: str, by: str | None, every: int | None) -> Callable[[JournalStore], Any]:
    def run(reader: JournalStore) -> Any:
        if by is None and every is None:
            return reader.stats(query)["requests"]
        return len(reader.group_stats(query, by=by, every=every))

    return run


def ship(path: Path, url: str) -> dict[str, Any]:
    """Ship the file to the fleet journal at `url` (schema created) as replica `bench`; the rate."""
    import psycopg

    from journal.pg import outbox
    from journal.pg import schema as pg_schema
    from journal.pg.read import PostgresReader
    from journal.pg.shipper import Shipper

    with psycopg.connect(url, autocommit=True) as conn:
        pg_schema.migrate(conn)
    local = schema.connect(path)
    try:
        outbox.uninstall(local)  # a file that shipped before: its whole history is queued again
        total = int(local.execute("SELECT count(*) FROM requests WHERE completed = 1").fetchone()[0])
    finally:
        local.close()
    shipper = Shipper(path, url, "bench")
    started = time.perf_counter()
    shipper.start()
    try:
        with PostgresReader(url) as fleet:
            while (shipped := fleet.count()) < total:
                if time.perf_counter() - started > 3600:
                    raise RuntimeError(f"shipped {shipped} of {total} requests in an hour: {shipper.stats}")
                time.sleep(0.5)
    finally:
        shipper.stop()
    elapsed = time.perf_counter() - started
    return {"requests": total, "ship_s": elapsed, "requests_per_s": total / elapsed}


def _samples(path: Path) -> dict[str, str]:
    with JournalReader(path) as reader:
        row = reader.connection.execute(
            "SELECT trace_id, key_fp FROM requests WHERE trace_id IS NOT NULL AND key_fp IS NOT NULL"
            " ORDER BY rowid DESC LIMIT 1 OFFSET 1000"
        ).fetchone()
    return {"trace": row[0], "key": row[1]}


class LockProbe:
    """Takes and releases the write lock every `interval` seconds on its own connection; the
    longest wait is how long a gateway's writer could have been held off."""

    def __init__(self, path: Path, interval: float = 0.02) -> None:
        self.path = path
        self.interval = interval
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> LockProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        conn = schema.connect(self.path)
        conn.execute("PRAGMA busy_timeout=60000")
        try:
            while not self._stop.wait(self.interval):
                started = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("COMMIT")
                self.waits.append(time.perf_counter() - started)
        finally:
            conn.close()


def time_prune(path: Path, share: float = 0.1, *, shrink: bool = False) -> dict[str, Any]:
    """Prune a copy of `path` to `1 - share` of its data, with a lock probe running."""
    copy = path.with_name(path.stem + "-prune" + path.suffix)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy}{suffix}").unlink(missing_ok=True)
    conn = schema.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    shutil.copyfile(path, copy)
    conn = schema.connect(copy)
    target = int(used_bytes(conn) * (1 - share))
    conn.close()
    drop_cache(copy)
    try:
        with LockProbe(copy) as probe:
            started = time.perf_counter()
            options = {"shrink": True} if shrink else {}  # (an older prune has no such option)
            result = prune(copy, max_bytes=target, now=4_000_000_000.0, **options)
            elapsed = time.perf_counter() - started
        waits = sorted(probe.waits)
        return {
            "prune_s": elapsed,
            "requests_deleted": result.requests_deleted,
            "events_deleted": result.events_deleted,
            "bytes_before": result.bytes_before,
            "bytes_after": result.bytes_after,
            "writer_wait_max_s": waits[-1] if waits else None,
            "writer_wait_p99_s": waits[int(len(waits) * 0.99)] if waits else None,
        }
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.journal_scale", description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prune", action="store_true", help="also time prune --max-size (10%%) on a copy")
    parser.add_argument("--shrink", action="store_true", help="prune --shrink: also give the pages back")
    parser.add_argument("--only", default="", help="only the rows whose label contains this")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument(
        "--postgres", nargs="?", const="", default=None, metavar="URL", help="time the fleet journal (see above)"
    )
    parser.add_argument("--ship", action="store_true", help="with --postgres URL: ship the file there first")
    args = parser.parse_args(argv)
    if args.postgres is not None:
        return _postgres(args)
    samples = _samples(args.path)
    out: dict[str, Any] = {"path": str(args.path), "rows": []}
    with JournalReader(args.path) as reader:
        out["requests"] = reader.count()
    print(f"{args.path}: {out['requests']} requests")
    for label, run in _jobs(samples):
        if args.only not in label:
            continue
        figures = timed(args.path, run, args.reps)
        out["rows"].append({"label": label, **figures})
        cold, warm = figures["cold_s"], figures["warm_s"]
        print(f"{label[:48]:<48} cold {cold:7.3f}s  warm {warm:7.3f}s  -> {figures['result']}")
    if args.prune:
        figures = time_prune(args.path, shrink=args.shrink)
        flag = " --shrink" if args.shrink else ""
        out["prune"] = figures
        print(
            f"prune --max-size (10%){flag}: {figures['prune_s']:.2f}s, {figures['requests_deleted']} requests,"
            f" {figures['bytes_before'] / 1e6:.0f} -> {figures['bytes_after'] / 1e6:.0f} MB;"
            f" writer waited at most {figures['writer_wait_max_s']:.3f}s (p99 {figures['writer_wait_p99_s']:.3f}s)"
        )
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return 0


def _jobs(samples: dict[str, str]) -> list[tuple[str, Callable[[JournalStore], Any]]]:
    jobs: list[tuple[str, Callable[[JournalStore], Any]]] = [
        (query.format(**samples), _page(query.format(**samples))) for _, query in QUERIES
    ]
    return jobs + [(label, _stats(query, by, every)) for label, query, by, every in STATS]


def _exit(*_: object) -> None:
    raise SystemExit(1)


def _postgres(args: argparse.Namespace) -> int:
    server = None
    url = args.postgres
    if not url:
        import signal

        from tools.servers.postgres import PostgresServer

        # A `timeout` or Ctrl-C still stops the server the bench started (atexit does not run on SIGTERM).
        signal.signal(signal.SIGTERM, _exit)
        server = PostgresServer().start()
        url = server.create_database("bench")
    try:
        out: dict[str, Any] = {"path": str(args.path), "rows": []}
        if args.ship or server is not None:
            out["ship"] = shipped = ship(args.path, url)
            print(
                f"shipped {shipped['requests']} requests in {shipped['ship_s']:.1f}s"
                f" ({shipped['requests_per_s']:.0f} requests/s)"
            )
        samples = _samples(args.path)
        with open_journal(url) as reader:
            out["requests"] = reader.count()
        print(f"fleet journal: {out['requests']} requests")
        for label, run in _jobs(samples):
            if args.only not in label:
                continue
            figures = timed(url, run, args.reps)
            out["rows"].append({"label": label, **figures})
            cold, warm = figures["cold_s"], figures["warm_s"]
            print(f"{label[:48]:<48} cold {cold:7.3f}s  warm {warm:7.3f}s  -> {figures['result']}")
        if args.json:
            args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    finally:
        if server is not None:
            server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
