"""Shared fixtures: a scripted worker and gateways as real processes on loopback ports."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.events import Completed, Error, Event
from journal.reader import JournalNotFound, JournalReader
from tools.spawn import Spawned, spawn_gateway, spawn_worker

MODEL = "scripted-model"
OTHER_MODEL = "other-model"

# Tests whose windows are measured against a loaded machine (a kill -9 under load, an outage's
# backlog draining while serving goes on, lease expiry, a state server known to be down, the
# writer's hot path, the inspector following live traffic): they are marked `serial`, and
# `make test` runs them apart, after the parallel run of the rest.
SERIAL = (
    "tests/journal/test_durability.py",
    "tests/journal/test_writer.py",
    "tests/inspector/test_live.py",
    "tests/fleet/test_fleet_gateway.py",
    "tests/fleet_redis/test_outage.py",
    "tests/fleet_redis/test_fleet_concurrency.py",
    "tests/server/test_big_bodies.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        if item.path.relative_to(root).as_posix() in SERIAL:
            item.add_marker(pytest.mark.serial)


class Scripted:
    """The test's handle on the scripted worker: queue answers, read what it received."""

    def __init__(self, url: str) -> None:
        self.url = url

    def reset(self) -> None:
        httpx.post(f"{self.url}/_reset").raise_for_status()

    def script(self, *answers: dict[str, Any], path: str = "/v1/messages") -> None:
        httpx.post(f"{self.url}/_script", json={"path": path, "answers": list(answers)}).raise_for_status()

    def received(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/_received").json()["requests"]

    def release(self) -> None:
        """Let a stream scripted with `hold_after` write the rest of its frames."""
        httpx.post(f"{self.url}/_release").raise_for_status()

    def health(self, healthy: bool) -> None:
        httpx.post(f"{self.url}/_health", json={"healthy": healthy}).raise_for_status()


def wait_for_events(journal: Path, request_id: str, timeout: float = 10.0) -> list[Event]:
    """The request's journaled events once its `completed` event is committed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with JournalReader(journal) as reader:
                events = [e for _, e in reader.events(request_id)]
        except JournalNotFound:
            events = []
        if events and events[-1].kind == "completed":
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"request {request_id} not complete in the journal: {[e.kind for e in events]}")
        time.sleep(0.05)


def journaled_failure(journal: Path, request_id: str, status: int, code: str, *, answered: int | None = None) -> Error:
    """The request's one `error` event, checked to say `status` and `code`; its `completed` says
    the status the client got (`answered`: 200 for a stream that had started; default `status`)."""
    events = wait_for_events(journal, request_id)
    errors = [e for e in events if isinstance(e, Error)]
    assert len(errors) == 1, [e.kind for e in events]
    assert (errors[0].status, errors[0].code) == (status, code), errors[0]
    completed = events[-1]
    assert isinstance(completed, Completed) and completed.status == (answered or status), completed
    return errors[0]


@pytest.fixture(scope="session")
def worker() -> Iterator[Spawned]:
    proc = spawn_worker(models=[MODEL, OTHER_MODEL])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def scripted(worker: Spawned) -> Scripted:
    handle = Scripted(worker.url)
    handle.reset()
    return handle


@pytest.fixture(scope="session")
def journal_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("journal") / "smg-journal.db"


@pytest.fixture(scope="session")
def gateway(worker: Spawned, journal_path: Path) -> Iterator[Spawned]:
    """The suite's main gateway: one HTTP worker, an alias, retries off so scripted errors
    reach the client as the worker sent them."""
    proc = spawn_gateway(
        [worker.url],
        journal=journal_path,
        extra=["--disable-retries", "--model-alias", f"alias-model={MODEL}"],
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(gateway: Spawned) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30.0) as http:
        yield http
