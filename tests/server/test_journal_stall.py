"""A real gateway under streaming load while this process holds the journal's write lock
(`BEGIN IMMEDIATE`, as another gateway or a backup tool would): the held buffer takes what the
queue cannot, so nothing is lost before `--journal-max-held` events are held; when something is,
the log's count and `smg_journal_events_dropped_total` agree."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from journal.reader import JournalReader
from tests.conftest import MODEL, wait_for_events
from tests.observability.test_metrics_live import scrape
from tools.spawn import Spawned, free_port, spawn_gateway

WORDS = " ".join(f"w{i}" for i in range(300))  # echoed back as a stream: several relayed reads
BODY = {"model": MODEL, "max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": WORDS}]}
# A held buffer this load fills in seconds; its queue is half of it. Before, a commit waiting on
# the lock dropped whatever did not fit in the queue, however much of the buffer was free.
MAX_HELD = 6000
QUEUE = MAX_HELD // 2


class Load:
    """Client threads streaming requests until stopped; the gateway's ids of every answer."""

    def __init__(self, url: str, clients: int = 6) -> None:
        self.ids: list[str] = []
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url,)) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not self._stop.is_set():
                with http.stream("POST", "/v1/messages", json=BODY) as response:
                    response.read()
                self.ids.append(response.headers["x-request-id"])
                self.statuses.append(response.status_code)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@contextmanager
def gateway_with_metrics(worker: Spawned, journal: Path, *extra: str) -> Iterator[tuple[Spawned, int]]:
    port = free_port()
    gateway = spawn_gateway(
        [worker.url],
        journal=journal,
        extra=["--disable-retries", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port), *extra],
    )
    try:
        yield gateway, port
    finally:
        gateway.stop()


def _hold_lock_until(journal: Path, port: int, done: object, timeout: float = 90.0) -> None:
    """Hold the write lock until `done(scrape)` is true (the test fails if it never is)."""
    other = sqlite3.connect(journal, isolation_level=None, timeout=30)
    other.execute("BEGIN IMMEDIATE")
    try:
        deadline = time.monotonic() + timeout
        while not done(scrape(port)):  # type: ignore[operator]
            assert time.monotonic() < deadline, "the gateway never got there"
            time.sleep(0.05)
    finally:
        other.execute("ROLLBACK")
        other.close()


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/readiness").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_held_write_lock_loses_no_request(worker: Spawned, tmp_path: Path) -> None:
    journal = tmp_path / "stalled.db"
    with gateway_with_metrics(worker, journal, "--journal-max-held", str(MAX_HELD)) as (gateway, port):
        httpx.post(f"{gateway.url}/v1/messages", json=BODY, timeout=30).raise_for_status()  # the file exists
        load = Load(gateway.url)
        try:
            # Locked until more is held than the queue holds: before, a commit waiting on the
            # lock for over a second dropped everything beyond the queue.
            _hold_lock_until(
                journal,
                port,
                lambda m: (
                    m.value("smg_journal_queue_depth") + m.value("smg_journal_pending_events") > QUEUE * 4 // 3
                    or m.value("smg_journal_events_dropped_total") > 0
                ),
            )
        finally:
            load.stop()
        _wait_ready(gateway.url)
        assert scrape(port).value("smg_journal_events_dropped_total") == 0
        assert load.ids and set(load.statuses) == {200}
        for request_id in load.ids:
            assert wait_for_events(journal, request_id, timeout=60)[-1].kind == "completed"
        with JournalReader(journal) as reader:
            assert reader.connection.execute("SELECT count(*) FROM requests WHERE completed = 0").fetchone()[0] == 0
    assert set(re.findall(r"(\d+) events were dropped during the incident", gateway.log())) <= {"0"}


def test_when_the_held_buffer_is_full_the_log_and_the_metric_count_the_same_drops(
    worker: Spawned, tmp_path: Path
) -> None:
    journal = tmp_path / "small.db"
    with gateway_with_metrics(worker, journal, "--journal-max-held", "1000") as (gateway, port):
        httpx.post(f"{gateway.url}/v1/messages", json=BODY, timeout=30).raise_for_status()
        load = Load(gateway.url)
        try:
            # Until the buffer overflowed and a commit failed: drops both while the first commit
            # waits on the lock and after it failed (before, the failure reset the log's count).
            _hold_lock_until(
                journal,
                port,
                lambda m: m.value("smg_journal_events_dropped_total") > 0 and m.value("smg_journal_failing") == 1,
            )
        finally:
            load.stop()
        _wait_ready(gateway.url)
        dropped = scrape(port).value("smg_journal_events_dropped_total")
    log = gateway.log()
    assert log.count("journal: cannot commit") == 1
    counts = [int(n) for n in re.findall(r"(\d+) events were dropped during the incident", log)]
    assert counts == [dropped] and dropped > 0


def test_readiness_says_the_journal_is_failing_while_it_drops_and_no_request_stays_in_flight(
    worker: Spawned, tmp_path: Path
) -> None:
    journal = tmp_path / "dropping.db"
    seen: list[httpx.Response] = []

    def dropping(metrics: object) -> bool:
        if metrics.value("smg_journal_events_dropped_total") == 0:  # type: ignore[attr-defined]
            return False
        seen.append(httpx.get(f"{gateway.url}/readiness"))
        return True

    with gateway_with_metrics(worker, journal, "--journal-max-held", "1000") as (gateway, port):
        httpx.post(f"{gateway.url}/v1/messages", json=BODY, timeout=30).raise_for_status()
        load = Load(gateway.url)
        try:
            _hold_lock_until(journal, port, dropping)
        finally:
            load.stop()
        # Before, the gateway stayed ready while a commit stalled on the lock and dropped events.
        assert seen[0].status_code == 503
        assert seen[0].json()["status"] == "not ready" and seen[0].json()["reason"].startswith("journal: ")
        _wait_ready(gateway.url)  # and ready again once commits resume
        assert scrape(port).value("smg_journal_events_dropped_total") > 0
        deadline = time.monotonic() + 60
        while True:  # requests whose completion was dropped are closed once the writer caught up
            with JournalReader(journal) as reader:
                in_flight = reader.connection.execute("SELECT count(*) FROM requests WHERE completed = 0").fetchone()[0]
            if in_flight == 0:
                break
            assert time.monotonic() < deadline, f"{in_flight} requests stay in flight"
            time.sleep(0.1)
    assert "since the last line" in gateway.log()
