"""Bench of the journal sink: how fast a replica's journal ships into a local PostgreSQL, and the lag at a steady load.

    python -m tools.bench.journal_sink [--requests 20000] [--rate 500] [--seconds 10]

1. Backlog: a journal of the mixed traffic `tools.build_journal` writes (streams packed into
   runs, relays, errors, sessions; its requests as the real writer stores them) is queued whole
   and shipped by the real `journal.pg.shipper.Shipper`; printed: requests (and event rows) per
   second from the first batch to the last.
2. Steady load: a writer appends `--rate` requests a second of that traffic for `--seconds`
   while the shipper runs; printed: the lag (`smg_journal_sink_lag_seconds`, sampled every
   100 ms) median, p95 and max, and how long after the last request the backlog was empty.

PostgreSQL is a real server in a temp dir (`tools.servers.postgres`, fsync off); figures are
printed, not asserted, and depend on the machine (and what else runs on it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from journal.events import Received
from journal.pg import schema
from journal.pg.shipper import Shipper
from journal.writer import JournalWriter
from tools.bench.common import load_average
from tools.build_journal import Traffic, build, requests
from tools.servers.postgres import PostgresServer


def _backlog(server: PostgresServer, workdir: Path, count: int) -> None:
    path = workdir / "backlog.db"
    started = time.monotonic()
    asyncio.run(build(path, Traffic(count, span_s=3 * 86_400.0)))
    print(f"journal: {count} requests of mixed traffic built in {time.monotonic() - started:.1f}s")
    url = server.create_database("backlog")
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn)
    shipper = Shipper(path, url, "bench-1", batch_size=2000)
    started = time.monotonic()
    cpu_before = time.process_time()
    shipper.start()
    backend: int | None = None
    try:
        while shipper.stats["requests_shipped"] + shipper.stats["duplicates"] < count:
            if backend is None:
                backend = _backend_pid(url)
                server_before = _cpu_seconds(backend) if backend is not None else 0.0
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        server_cpu = _cpu_seconds(backend) - server_before if backend is not None else float("nan")
    finally:
        shipper.stop()
    client_cpu = time.process_time() - cpu_before
    stats = shipper.stats
    print(
        f"backlog: {count} requests ({int(stats['events_shipped'])} event rows) shipped in {elapsed:.2f}s:"
        f" {count / elapsed:,.0f} requests/s, {stats['events_shipped'] / elapsed:,.0f} rows/s,"
        f" {int(stats['batches'])} batches"
    )
    # CPU time per request does not depend on what else the machine runs: it says what one core
    # each for the shipper and for PostgreSQL would ship.
    per_client, per_server = client_cpu / count * 1e6, server_cpu / count * 1e6
    print(
        f"backlog CPU per request: shipper {per_client:.0f} µs, PostgreSQL backend {per_server:.0f} µs"
        f" (at one core each: {1e6 / max(per_client, per_server):,.0f} requests/s)"
    )


def _backend_pid(url: str) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'smg-shipper'").fetchone()
    return int(row[0]) if row else None


def _cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _steady_writer(path: Path, rate: float, seconds: float, done: threading.Event) -> int:
    writer = JournalWriter(path)
    await writer.start()
    traffic = requests(Traffic(int(rate * seconds) + 1, seed=7))
    sent = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            due = int((time.monotonic() - started) * rate)
            while sent < due:
                request_id, events = next(traffic)
                now = time.time()
                for seq, event in enumerate(events, 1):
                    if isinstance(event, Received):
                        event = dataclasses.replace(event, ts=now)  # it arrives now
                    await writer.append("steady-" + request_id, seq, event)
                sent += 1
            await asyncio.sleep(0.005)
        await writer.flush()
    finally:
        await writer.close()
        done.set()
    return sent


def _steady(server: PostgresServer, workdir: Path, rate: float, seconds: float) -> None:
    path = workdir / "steady.db"
    url = server.create_database("steady")
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn)
    asyncio.run(build(path, Traffic(1)))  # the file exists (the shipper queues from its triggers)
    shipper = Shipper(path, url, "bench-1")
    shipper.start()
    done = threading.Event()
    lags: list[float] = []

    def sample() -> None:
        while not done.is_set():
            lags.append(shipper.stats["lag_seconds"])
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        sent = asyncio.run(_steady_writer(path, rate, seconds, done))
        ended = time.monotonic()
        while shipper.stats["unshipped"] > 0 or shipper.stats["requests_shipped"] < sent:
            time.sleep(0.01)
        drained = time.monotonic() - ended
    finally:
        shipper.stop()
        sampler.join()
    lags.sort()
    p95 = lags[int(len(lags) * 0.95)] if lags else 0.0
    print(
        f"steady: {sent} requests at {rate:.0f}/s for {seconds:.0f}s:"
        f" lag median {statistics.median(lags) * 1000:.0f} ms,"
        f" p95 {p95 * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms; backlog empty {drained * 1000:.0f} ms after the last"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.journal_sink", description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000, help="requests in the backlog run")
    parser.add_argument("--rate", type=float, default=500.0, help="requests a second in the steady run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the steady run")
    args = parser.parse_args(argv)
    print(f"load average before: {load_average()}")
    with tempfile.TemporaryDirectory(prefix="smg-bench-sink-") as tmp, PostgresServer() as server:
        _backlog(server, Path(tmp), args.requests)
        _steady(server, Path(tmp), args.rate, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
