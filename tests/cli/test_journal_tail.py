"""`smg journal tail` as a real process following the journal of the suite's gateway.

Each test starts the command, waits for it to say it is following, then sends requests
through the gateway and reads what the command prints.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from journal.reader import JournalReader
from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import REPO_ROOT

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "for tail"}]}


class Tail:
    """`smg journal tail …` in a subprocess, its output lines collected as they come."""

    def __init__(self, journal: Path, *args: str, sigint_ignored: bool = False) -> None:
        command = [sys.executable, "-m", "smg", "journal", "tail", "--journal", str(journal), "--interval", "0.05"]
        command += args
        if sigint_ignored:  # as a shell starts a background job (`cmd &` in a script, CI runners): exec keeps it
            command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command]
        self.proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.out.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append), daemon=True).start()

    @staticmethod
    def _pump(stream: IO[str], put: Any) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def following(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(line.startswith("following") for line in self.err):
            assert self.proc.poll() is None, f"tail exited: {self.err}"
            assert time.monotonic() < deadline, f"tail never started following: {self.err}"
            time.sleep(0.02)

    def line(self, timeout: float = 15.0) -> str:
        return self.out.get(timeout=timeout)

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def tails() -> Iterator[list[Tail]]:
    started: list[Tail] = []
    yield started
    for tail in started:
        tail.stop()


def start(tails: list[Tail], journal: Path, *args: str, sigint_ignored: bool = False) -> Tail:
    tail = Tail(journal, *args, sigint_ignored=sigint_ignored)
    tails.append(tail)
    tail.following()
    return tail


def test_tail_prints_matching_requests_as_they_complete(
    client: httpx.Client, scripted: Scripted, journal_path: Path, tails: list[Tail]
) -> None:
    client.get("/health")  # the journal file exists once the gateway is up
    tail = start(tails, journal_path, "id:tail1-* status:200", "--json", "--max", "2", "--timeout", "60")
    client.post("/v1/messages", json=BODY, headers={"x-request-id": "tail1-a"})
    client.post("/v1/messages", json={"model": MODEL}, headers={"x-request-id": "tail1-rejected"})
    client.post("/v1/messages", json=BODY, headers={"x-request-id": "other-tail1"})
    client.post("/v1/messages", json={**BODY, "stream": True}, headers={"x-request-id": "tail1-b"})
    first, second = json.loads(tail.line()), json.loads(tail.line())
    assert [first["client_id"], second["client_id"]] == ["tail1-a", "tail1-b"]
    assert first["status"] == 200 and first["completed"] is True and second["stream"] is True
    with JournalReader(journal_path) as reader:
        assert first == reader.get_request("tail1-a")
    assert tail.wait() == 0
    assert tail.out.empty()


def test_tail_shows_a_stream_that_was_in_flight_when_it_started(
    client: httpx.Client, scripted: Scripted, journal_path: Path, tails: list[Tail]
) -> None:
    scripted.script({"stream_echo": True, "hold_after": 1})
    done: list[str] = []

    def held() -> None:
        body = {**BODY, "stream": True}
        with client.stream("POST", "/v1/messages", json=body, headers={"x-request-id": "tail2-held"}) as r:
            done.append(r.read().decode())

    thread = threading.Thread(target=held)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while True:  # the request is journaled and in flight
            with JournalReader(journal_path) as reader:
                row = reader.get_request("tail2-held")
            if row is not None and row["ttfe_ms"] is not None:
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not row["completed"]
        tail = start(tails, journal_path, "id:tail2-*", "--json", "--max", "1", "--timeout", "60")
        time.sleep(0.3)  # a few polls with the request still open: nothing to print yet
        assert tail.out.empty()
    finally:
        scripted.release()
        thread.join(10)
    assert done and "message_stop" in done[0]
    assert json.loads(tail.line())["client_id"] == "tail2-held"
    assert tail.wait() == 0


def test_tail_human_lines(client: httpx.Client, scripted: Scripted, journal_path: Path, tails: list[Tail]) -> None:
    tail = start(tails, journal_path, "id:tail3-*", "--max", "1", "--timeout", "60")
    client.post("/v1/messages", json=BODY, headers={"x-request-id": "tail3-line"})
    line = tail.line()
    assert tail.wait() == 0
    for text in ("tail3-line", " 200 ", "POST /v1/messages", MODEL, "backend=http", "stop=end_turn"):
        assert text in line, (text, line)


def test_tail_timeout_with_nothing_new(journal_path: Path, client: httpx.Client, tails: list[Tail]) -> None:
    tail = start(tails, journal_path, "id:tail4-*", "--timeout", "0.5")
    assert tail.wait() == 0
    assert tail.out.empty()


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "started-with-sigint-ignored"])
def test_tail_stops_cleanly_on_ctrl_c(
    journal_path: Path, client: httpx.Client, tails: list[Tail], sigint_ignored: bool
) -> None:
    # A suite run as a background job (a script's `make test &`, a CI runner) hands its
    # children SIGINT ignored; Ctrl-C must stop the tail all the same.
    tail = start(tails, journal_path, sigint_ignored=sigint_ignored)
    tail.proc.send_signal(signal.SIGINT)
    assert tail.wait() == 0
    time.sleep(0.1)  # let the reader threads drain stderr
    assert not any("Traceback" in line for line in tail.err), tail.err


def test_tail_waits_for_the_journal_to_appear(
    worker: Any, tmp_path: Path, tails: list[Tail], scripted: Scripted
) -> None:
    from tools.spawn import spawn_gateway

    journal = tmp_path / "later.db"
    tail = Tail(journal, "--json", "--max", "1", "--timeout", "60")
    tails.append(tail)
    deadline = time.monotonic() + 30
    while not any("waiting for" in line for line in tail.err):
        assert time.monotonic() < deadline and tail.proc.poll() is None, tail.err
        time.sleep(0.02)
    with spawn_gateway([worker.url], journal=journal) as gateway:
        tail.following()
        httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers={"x-request-id": "tail5-first"}, timeout=30)
        wait_for_events(journal, "tail5-first")
        assert json.loads(tail.line())["client_id"] == "tail5-first"
    assert tail.wait() == 0


def test_tail_refuses_a_bad_query(journal_path: Path, client: httpx.Client) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "smg", "journal", "tail", "status:>>", "--journal", str(journal_path), "--timeout", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "bad query" in done.stderr and "Traceback" not in done.stderr
