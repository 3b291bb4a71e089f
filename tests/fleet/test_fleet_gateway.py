"""`smg launch --journal-sink`: real gateways shipping to a real PostgreSQL, under load and faults.

Each replica is a `smg launch` process with its own local journal; the fleet journal must hold
exactly the requests each local journal completed, once each, tagged with its replica, after a
kill -9 of a replica, an outage of PostgreSQL, or both replicas shipping at once. A sink that
cannot be used is an exit 2 at start with one line saying why.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from journal.pg import schema
from tests.conftest import MODEL
from tests.journal.test_durability import COMMIT_WINDOW_S, Load
from tools.servers.postgres import PostgresServer
from tools.spawn import Spawned, free_port, spawn_gateway


def until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _init(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn)
    return url


def _replica(worker: Spawned, journal: Path, sink: str, name: str, *extra: str) -> Spawned:
    return spawn_gateway(
        [worker.url],
        journal=journal,
        extra=["--disable-retries", "--journal-sink", sink, "--replica-name", name, *extra],
    )


def _completed(journal: Path) -> set[str]:
    conn = sqlite3.connect(journal)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM requests WHERE completed = 1")}
    finally:
        conn.close()


def _shipped(url: str, replica: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM requests WHERE replica = %s", (replica,))]


def _client_ids(url: str, replica: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT client_id FROM requests WHERE replica = %s", (replica,))
        return {row[0] for row in rows}


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the metrics")


# -- start-up errors --------------------------------------------------------------------------


def _launch_fails(worker: Spawned, tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "smg",
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--worker-urls",
            worker.url,
            "--journal",
            str(tmp_path / "j.db"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("smg launch:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_url_that_is_not_postgresql_is_refused(worker: Spawned, tmp_path: Path) -> None:
    line = _launch_fails(worker, tmp_path, "--journal-sink", "mysql://127.0.0.1/x")
    assert "must be a postgresql:// URL" in line


def test_an_unreachable_server_is_refused(worker: Spawned, tmp_path: Path) -> None:
    line = _launch_fails(worker, tmp_path, "--journal-sink", f"postgresql://smg:x@127.0.0.1:{free_port()}/smg")
    assert "--journal-sink postgresql://smg@127.0.0.1:" in line and "refused" in line.lower()


def test_wrong_credentials_are_refused_and_the_password_is_not_printed(
    worker: Spawned, tmp_path: Path, postgres: PostgresServer, pg_url: str
) -> None:
    bad = pg_url.replace(":smg-test-password@", ":not-the-password@")
    line = _launch_fails(worker, tmp_path, "--journal-sink", bad)
    assert "password authentication failed" in line and "not-the-password" not in line


def test_a_database_without_the_schema_is_refused(worker: Spawned, tmp_path: Path, pg_url: str) -> None:
    line = _launch_fails(worker, tmp_path, "--journal-sink", pg_url)
    assert "has no smg journal schema" in line and "smg journal-sink init" in line
    with psycopg.connect(pg_url) as conn:
        assert schema.version(conn) == 0  # nothing was created behind the operator's back


def test_a_database_that_does_not_exist_is_refused(worker: Spawned, tmp_path: Path, postgres: PostgresServer) -> None:
    line = _launch_fails(worker, tmp_path, "--journal-sink", postgres.url("no_such_db"))
    assert 'database "no_such_db" does not exist' in line


def test_a_sink_needs_the_local_journal(worker: Spawned, tmp_path: Path, pg_url: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "smg",
            "launch",
            "--port",
            str(free_port()),
            "--worker-urls",
            worker.url,
            "--no-journal",
            "--journal-sink",
            _init(pg_url),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--no-journal" in done.stderr


def test_init_creates_the_schema_then_a_replica_ships(worker: Spawned, tmp_path: Path, pg_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "smg", "journal-sink", "init", pg_url], capture_output=True, text=True)
    assert done.returncode == 0 and f"from version 0 to {schema.SCHEMA_VERSION}" in done.stdout
    assert "smg-test-password" not in done.stdout
    journal = tmp_path / "j.db"
    gateway = _replica(worker, journal, pg_url, "solo")
    try:
        for i in range(5):
            body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": f"hi {i}"}]}
            assert httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=10).status_code == 200
        until(lambda: len(_shipped(pg_url, "solo")) == 5, what="shipping")
    finally:
        gateway.stop()
    assert sorted(_shipped(pg_url, "solo")) == sorted(_completed(journal))


# -- faults -----------------------------------------------------------------------------------


def test_two_replicas_one_killed_under_load_every_completed_request_once(
    worker: Spawned, tmp_path: Path, pg_url: str
) -> None:
    sink = _init(pg_url)
    a_journal, b_journal = tmp_path / "a.db", tmp_path / "b.db"
    a = _replica(worker, a_journal, sink, "replica-a")
    b = _replica(worker, b_journal, sink, "replica-b")
    restarted: Spawned | None = None
    try:
        with Load(b.url) as b_load:
            with Load(a.url) as a_load:
                until(lambda: len(a_load.completed) > 200 and len(_shipped(sink, "replica-a")) > 50, what="load")
                killed_at = time.monotonic()
                a.kill()
            b_before = len(b_load.completed)
            until(lambda: len(b_load.completed) > b_before + 50, what="the other replica serving on")
            restarted = _replica(worker, a_journal, sink, "replica-a")
        assert b_load.failed == 0
        # Once restarted, the killed replica ships what it had completed and not shipped yet.
        until(lambda: sorted(_shipped(sink, "replica-a")) == sorted(_completed(a_journal)), what="a's backlog")
        until(lambda: sorted(_shipped(sink, "replica-b")) == sorted(_completed(b_journal)), what="b's backlog")
    finally:
        for gateway in (a, b, restarted):
            if gateway is not None:
                gateway.stop()
    for name, journal in (("replica-a", a_journal), ("replica-b", b_journal)):
        shipped = _shipped(sink, name)
        assert len(shipped) == len(set(shipped)) == len(_completed(journal))  # exactly once each
    durable = {rid for rid, done in a_load.completed.items() if done < killed_at - COMMIT_WINDOW_S}
    assert durable <= _client_ids(sink, "replica-a")  # what the client saw complete before the window
    assert set(b_load.completed) <= _client_ids(sink, "replica-b")


def test_postgresql_stopped_under_load_serving_goes_on_and_the_backlog_drains(
    worker: Spawned, tmp_path: Path, own_postgres: PostgresServer
) -> None:
    sink = _init(own_postgres.url())
    journal = tmp_path / "j.db"
    metrics_port = free_port()
    gateway = _replica(
        worker, journal, sink, "web-1", "--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1"
    )
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    lag_seen = 0.0
    try:
        with Load(gateway.url) as load:
            until(lambda: len(_shipped(sink, "web-1")) > 50, what="shipping before the outage")
            own_postgres.stop()
            outage_ends = time.monotonic() + 10.0
            served_before = len(load.completed)
            while time.monotonic() < outage_ends:
                lag_seen = max(lag_seen, _metric(metrics_url, "smg_journal_sink_lag_seconds"))
                time.sleep(0.5)
            # The shipper reads the lag between its retries (0.5, 1, 2, 4, then every 5 s): on
            # a loaded machine its next reading may come after the ten seconds.
            lag_seen = max(
                lag_seen,
                until(
                    lambda: (lag := _metric(metrics_url, "smg_journal_sink_lag_seconds")) > 5.0 and lag,
                    20.0,
                    what="the lag growing past 5 s while PostgreSQL is down",
                ),
            )
            assert _metric(metrics_url, "smg_journal_sink_failures_total") >= 1
            assert _metric(metrics_url, "smg_journal_sink_unshipped_requests") > 0
            assert len(load.completed) > served_before + 100  # serving went on through the outage
            own_postgres.start()
            # The load goes on at full speed on the same cores as the shipper (whose steady lag
            # under it is about two seconds), so the rule is that the outage's backlog drains,
            # back under the lag it had grown past, while serving goes on.
            until(lambda: _metric(metrics_url, "smg_journal_sink_lag_seconds") < 4.0, 60.0, what="the lag draining")
        assert load.failed == 0  # no request failed because PostgreSQL was away
        until(lambda: _metric(metrics_url, "smg_journal_sink_unshipped_requests") == 0, what="the backlog draining")
    finally:
        gateway.stop()
    assert lag_seen > 5.0  # the lag grew while PostgreSQL was down
    shipped = _shipped(sink, "web-1")
    assert len(shipped) == len(set(shipped))
    assert set(shipped) == _completed(journal)
    assert set(load.completed) <= _client_ids(sink, "web-1")


def test_several_processes_on_one_file_ship_each_request_once(worker: Spawned, tmp_path: Path, pg_url: str) -> None:
    sink = _init(pg_url)
    journal = tmp_path / "j.db"
    gateway = _replica(worker, journal, sink, "forked", "--workers", "2")
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            for i in range(40):
                body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": f"hi {i}"}]}
                assert http.post("/v1/messages", json=body).status_code == 200
        until(lambda: len(_shipped(sink, "forked")) >= 40, what="shipping")
        until(lambda: sorted(_shipped(sink, "forked")) == sorted(_completed(journal)), what="all of it")
        with psycopg.connect(sink) as conn:  # the process that does not hold the ship lock never connects
            shippers = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'smg-shipper'"
                " AND datname = current_database()"
            ).fetchone()
        assert shippers == (1,)
    finally:
        gateway.stop()
    shipped = _shipped(sink, "forked")
    assert len(shipped) == len(set(shipped)) == 40


def test_a_gateway_without_a_sink_stops_queueing_on_a_file_that_shipped(
    worker: Spawned, tmp_path: Path, pg_url: str
) -> None:
    sink = _init(pg_url)
    journal = tmp_path / "j.db"
    shipping = _replica(worker, journal, sink, "was-shipping")
    shipping.stop()
    conn = sqlite3.connect(journal)
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'sink_queue%'").fetchone() == (5,)
    conn.close()
    plain = spawn_gateway([worker.url], journal=journal)
    try:
        body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{plain.url}/v1/messages", json=body, timeout=10).status_code == 200
    finally:
        plain.stop()
    conn = sqlite3.connect(journal)
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'sink_queue%'").fetchone() == (0,)
    conn.close()
    assert "no longer ships" in plain.log()


def test_a_gateway_without_a_sink_keeps_the_queue_of_a_live_gateway_that_ships(
    worker: Spawned, tmp_path: Path, pg_url: str
) -> None:
    sink = _init(pg_url)
    journal = tmp_path / "j.db"
    metrics_port = free_port()
    shipping = _replica(
        worker, journal, sink, "live", "--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1"
    )
    plain: Spawned | None = None
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    try:
        metrics_url = f"http://127.0.0.1:{metrics_port}"
        until(lambda: _metric(metrics_url, "smg_journal_sink_shipping") == 1, what="the shipper to hold the lock")
        plain = spawn_gateway([worker.url], journal=journal)
        assert httpx.post(f"{plain.url}/v1/messages", json=body, timeout=10).status_code == 200
        for _ in range(5):  # completed after the sink-less gateway started
            assert httpx.post(f"{shipping.url}/v1/messages", json=body, timeout=10).status_code == 200
        until(lambda: len(_completed(journal)) == 6, what="the local journal")
        until(lambda: sorted(_shipped(sink, "live")) == sorted(_completed(journal)), what="every request shipped")
    finally:
        shipping.stop()
        if plain is not None:
            plain.stop()
    assert "no longer ships" not in plain.log()


def test_a_backlog_left_by_a_kill_during_an_outage_ships_after_the_restart(
    worker: Spawned, tmp_path: Path, own_postgres: PostgresServer
) -> None:
    sink = _init(own_postgres.url())
    journal = tmp_path / "j.db"
    gateway = _replica(worker, journal, sink, "web-1")
    restarted: Spawned | None = None
    try:
        own_postgres.stop()
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            for i in range(30):
                body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": f"hi {i}"}]}
                assert http.post("/v1/messages", json=body).status_code == 200
        until(lambda: len(_completed(journal)) == 30, what="the local journal")
        gateway.kill()  # with all 30 queued locally and none shipped
        own_postgres.start()
        assert _shipped(sink, "web-1") == []
        restarted = _replica(worker, journal, sink, "web-1")
        until(lambda: len(_shipped(sink, "web-1")) == 30, what="the backlog")
    finally:
        gateway.stop()
        if restarted is not None:
            restarted.stop()
    assert sorted(_shipped(sink, "web-1")) == sorted(_completed(journal))
