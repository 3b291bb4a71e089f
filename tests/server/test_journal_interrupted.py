"""Requests in flight when a gateway is killed are closed at the next start as `interrupted`
(status 0, code `interrupted`), and a live gateway's requests on a shared journal are not."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from journal.reader import JournalReader
from smg.cli.main import app
from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "held"}]}


def _hold(gateway: Spawned, request_id: str) -> threading.Thread:
    """A streamed request the worker holds after its first frame (the client gives up later)."""

    def run() -> None:
        try:
            with httpx.stream(
                "POST", f"{gateway.url}/v1/messages", json=BODY, headers={"x-request-id": request_id}, timeout=10
            ) as response:
                for _ in response.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass  # the gateway was killed under it

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _in_flight(journal: Path, request_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while True:
        try:
            with JournalReader(journal) as reader:
                row = reader.get_request(request_id)
        except Exception:
            row = None
        if row is not None and row["ttfe_ms"] is not None:
            return row
        assert time.monotonic() < deadline, "the request never showed in flight"
        time.sleep(0.05)


def test_a_killed_gateways_requests_are_closed_as_interrupted_at_the_next_start(
    worker: Spawned, scripted: Scripted, tmp_path: Path
) -> None:
    journal = tmp_path / "crash.db"
    scripted.script({"stream_echo": True, "hold_after": 1}, {"stream_echo": True, "hold_after": 1})
    first = spawn_gateway([worker.url], journal=journal)
    second: Spawned | None = None
    third: Spawned | None = None
    try:
        _hold(first, "killed-1")
        assert not _in_flight(journal, "killed-1")["completed"]
        first.kill()  # kill -9: nothing gets to close the request
        second = spawn_gateway([worker.url], journal=journal)
        _hold(second, "alive-1")
        assert not _in_flight(journal, "alive-1")["completed"]
        events = wait_for_events(journal, "killed-1")
        assert [e.kind for e in events[-2:]] == ["error", "completed"]
        with JournalReader(journal) as reader:
            row = reader.get_request("killed-1")
            assert row is not None and row["completed"] and row["status"] == 0
            assert row["error_code"] == "interrupted"
        # A gateway that starts beside a live one leaves that one's requests alone.
        third = spawn_gateway([worker.url], journal=journal)
        with httpx.Client(base_url=third.url, timeout=10) as client:
            assert client.get("/health").status_code == 200
        with JournalReader(journal) as reader:
            alive = reader.get_request("alive-1")
            assert alive is not None and not alive["completed"]
        listed = CliRunner().invoke(app, ["journal", "ls", "code:interrupted", "--json", "-j", str(journal)])
        assert listed.exit_code == 0 and "killed-1" in listed.stdout and "alive-1" not in listed.stdout
    finally:
        scripted.release()
        for gateway in (first, second, third):
            if gateway is not None:
                gateway.stop()
