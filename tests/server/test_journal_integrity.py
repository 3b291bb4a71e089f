"""The journal under hostile and careless clients, over loopback: request ids the gateway
mints (a reused or undecodable client id), refusals before auth, secrets in query strings,
and a journal file that cannot be committed to."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from journal.events import Received
from journal.reader import AmbiguousRequestId, JournalReader
from smg.cli.main import app
from smg.projection import reconstruct
from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
KEY = "integrity-gateway-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
runner = CliRunner()


@pytest.fixture(scope="module")
def keyed_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("integrity") / "journal.db"


@pytest.fixture(scope="module")
def keyed(worker: Spawned, keyed_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway([worker.url], journal=keyed_journal, extra=["--api-key", KEY, "--disable-retries"])
    try:
        yield proc
    finally:
        proc.stop()


def _journal_rows(journal: Path, query: str) -> list[dict[str, object]]:
    with JournalReader(journal) as reader:
        return reader.list_requests(1000, query=query)


def _wait_rows(journal: Path, query: str, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 15
    while True:
        rows = [r for r in _journal_rows(journal, query) if r["completed"]]
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def test_a_reused_client_id_gives_one_record_per_request(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    first = client.post("/v1/messages", json=BODY, headers={"x-request-id": "reused-7"})
    second = client.post("/v1/messages", json={"model": MODEL}, headers={"x-request-id": "reused-7"})
    assert first.status_code == 200 and second.status_code == 400
    assert first.headers["x-request-id"] == second.headers["x-request-id"] == "reused-7"  # echoed as sent
    assert first.headers["request-id"] == "reused-7" and second.json()["request_id"] == "reused-7"

    rows = _wait_rows(journal_path, "client_id:reused-7", 2)
    assert len(rows) == 2 and len({r["id"] for r in rows}) == 2
    assert sorted(r["status"] for r in rows) == [200, 400]  # each row is one request, not a mix
    with JournalReader(journal_path) as reader:
        for row in rows:
            kinds = [e.kind for _, e in reader.events(str(row["id"]))]
            assert kinds[0] == "received" and kinds[-1] == "completed" and kinds.count("received") == 1
        with pytest.raises(AmbiguousRequestId) as ambiguous:
            reader.get_request("reused-7")
    assert set(ambiguous.value.matches) == {r["id"] for r in rows}

    shown = runner.invoke(app, ["journal", "show", "reused-7", "-j", str(journal_path)])
    assert shown.exit_code == 1 and "several requests" in shown.output
    for row in rows:  # the gateway's id names each one
        one = runner.invoke(app, ["journal", "show", str(row["id"]), "-j", str(journal_path), "--json"])
        assert one.exit_code == 0, one.output
        assert json.loads(one.stdout)["request"]["client_id"] == "reused-7"


def test_a_unique_client_id_names_its_request_in_every_command(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    response = client.post("/v1/messages", json=BODY, headers={"x-request-id": "unique-client-id-1"})
    assert response.status_code == 200
    events = wait_for_events(journal_path, "unique-client-id-1")
    received = events[0]
    assert isinstance(received, Received) and received.client_request_id == "unique-client-id-1"
    assert received.request_id.startswith("msg_") and received.request_id != "unique-client-id-1"
    for command in (["show"], ["export", "--as", "curl"], ["export", "--as", "json"]):
        args = ["journal", command[0], "unique-client-id-1", *command[1:], "-j", str(journal_path)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    shown = json.loads(
        runner.invoke(app, ["journal", "show", "unique-client-id-1", "-j", str(journal_path), "--json"]).stdout
    )
    assert shown["request"]["id"] == received.request_id
    assert shown["response"]["headers"]["x-request-id"] == "unique-client-id-1"
    assert shown["response"]["headers"]["request-id"] == "unique-client-id-1"


def test_an_undecodable_request_id_costs_no_other_request_its_events(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    def normal(i: int) -> httpx.Response:
        return client.post("/v1/messages", json=BODY, headers={"x-request-id": f"neighbour-{i}"})

    with ThreadPoolExecutor(8) as pool:
        neighbours = [pool.submit(normal, i) for i in range(40)]
        # Refused at validation, so that only the journal's handling of the header is tested
        # here (forwarding such a header to a worker belongs to the backends).
        bad = client.post("/v1/messages", json={"model": MODEL}, headers={"x-request-id": b"bad-\xff\xfe-id"})
        replies = [f.result() for f in neighbours]
    assert bad.status_code == 400 and all(r.status_code == 200 for r in replies)
    minted = bad.headers["x-request-id"]
    assert bad.json()["request_id"] == minted
    assert minted.startswith("msg_")  # an id that cannot be echoed is replaced by the gateway's
    for i in range(40):
        assert [e.kind for e in wait_for_events(journal_path, f"neighbour-{i}")][-1] == "completed"
    events = wait_for_events(journal_path, minted)
    received = events[0]
    assert isinstance(received, Received) and received.client_request_id is None
    assert received.headers["x-request-id"] == "bad-\\udcff\\udcfe-id"  # kept, escaped


def test_with_a_key_an_undecodable_request_id_gets_its_401(keyed: Spawned, keyed_journal: Path) -> None:
    response = httpx.post(keyed.url + "/v1/messages", json=BODY, headers={"x-request-id": b"\xff\xfe"})
    assert response.status_code == 401, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert body["request_id"] == response.headers["x-request-id"]
    events = wait_for_events(keyed_journal, body["request_id"])
    assert [e.kind for e in events] == ["received", "rejected", "error", "completed"]


def test_a_request_refused_before_auth_is_journaled_without_its_body(keyed: Spawned, keyed_journal: Path) -> None:
    secret_text = "body-of-an-unauthenticated-client"
    response = httpx.post(
        keyed.url + "/v1/messages?key=sk-in-the-query",
        json={**BODY, "messages": [{"role": "user", "content": secret_text}]},
        headers={"x-request-id": "refused-no-body", "x-filler": "f" * 4000, "user-agent": "u" * 2000},
    )
    assert response.status_code == 401
    received = wait_for_events(keyed_journal, "refused-no-body")[0]
    assert isinstance(received, Received)
    assert received.body is None
    assert "x-filler" not in received.headers and len(received.headers["user-agent"]) <= 256
    assert "sk-in-the-query" not in received.query and received.query.startswith("key=[redacted")
    for file in keyed_journal.parent.glob(keyed_journal.name + "*"):
        data = file.read_bytes()
        assert secret_text.encode() not in data and b"sk-in-the-query" not in data

    allowed = httpx.post(
        keyed.url + "/v1/messages?api_key=sk-allowed&beta=1", json=BODY, headers={**AUTH, "x-request-id": "kept-body"}
    )
    assert allowed.status_code == 200
    kept = wait_for_events(keyed_journal, "kept-body")[0]
    assert isinstance(kept, Received) and kept.body is not None and "hi" in kept.body
    assert "sk-allowed" not in kept.query and kept.query.endswith("&beta=1")


def test_an_mcp_token_spelled_with_an_escape_never_reaches_the_file(keyed: Spawned, keyed_journal: Path) -> None:
    raw = (
        '{"model": "MODEL", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],'
        ' "mcp_servers": [{"type": "url", "url": "http://127.0.0.1:9/mcp", "name": "s",'
        ' "authorization\\u005ftoken": "mcp-escaped-secret", "authorization_token": "mcp-dup-secret"}]}'
    ).replace("MODEL", MODEL)
    response = httpx.post(
        keyed.url + "/v1/messages",
        content=raw.encode(),
        headers={**AUTH, "content-type": "application/json", "x-request-id": "mcp-escaped"},
    )
    assert response.status_code < 500
    wait_for_events(keyed_journal, "mcp-escaped")
    for file in keyed_journal.parent.glob(keyed_journal.name + "*"):
        data = file.read_bytes()
        assert b"mcp-escaped-secret" not in data and b"mcp-dup-secret" not in data


def test_a_locked_journal_shows_in_readiness_and_serving_goes_on(
    worker: Spawned, scripted: Scripted, tmp_path: Path
) -> None:
    journal = tmp_path / "locked.db"
    gateway = spawn_gateway([worker.url], journal=journal, extra=["--disable-retries"])
    try:
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            assert http.post("/v1/messages", json=BODY).status_code == 200  # the file exists
            assert http.get("/readiness").status_code == 200
            other = sqlite3.connect(journal, isolation_level=None, timeout=30)
            other.execute("BEGIN EXCLUSIVE")  # another process holds the file
            try:
                ids = [http.post("/v1/messages", json=BODY).headers["x-request-id"] for _ in range(5)]
                deadline = time.monotonic() + 30
                while (ready := http.get("/readiness")).status_code == 200 and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert ready.status_code == 503 and "journal" in ready.json()["reason"], ready.text
                assert "locked" in ready.json()["reason"]
                for _ in range(5):  # still serving, nothing waits on the file
                    ids.append(http.post("/v1/messages", json=BODY).headers["x-request-id"])
            finally:
                other.execute("ROLLBACK")
                other.close()
            deadline = time.monotonic() + 30
            while http.get("/readiness").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert http.get("/readiness").status_code == 200
        for request_id in ids:  # held while the file was locked, none lost
            assert wait_for_events(journal, request_id)[-1].kind == "completed"
    finally:
        gateway.stop()
    log = gateway.log()
    assert log.count("journal: cannot commit") == 1 and "journal: commits to" in log


def test_a_relayed_upstream_error_is_findable_by_its_type(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy, try later"}}
    scripted.script({"status": 529, "json": error})
    response = client.post("/v1/messages", json=BODY, headers={"x-request-id": "relayed-529"})
    assert response.status_code == 529
    events = wait_for_events(journal_path, "relayed-529")
    rows = _wait_rows(journal_path, "type:overloaded_error client_id:relayed-529", 1)
    assert len(rows) == 1 and rows[0]["status"] == 529 and rows[0]["error_type"] == "overloaded_error"
    rebuilt = reconstruct(events)  # the error event the journal gained changes nothing the client got
    assert rebuilt.status == 529 and rebuilt.body == response.content
    assert rebuilt.headers["request-id"] == response.headers["request-id"] == "relayed-529"


def test_a_replay_row_keeps_the_targets_error_code(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    zero = {**BODY, "max_tokens": 0}  # the HTTP relay refuses it with a code of its own
    response = client.post("/v1/messages", json=zero, headers={"x-request-id": "replay-code-original"})
    assert response.status_code == 400 and response.headers["x-smg-error-code"] == "max_tokens_zero_not_relayed"
    wait_for_events(journal_path, "replay-code-original")
    result = runner.invoke(
        app, ["replay", "replay-code-original", "--to", str(client.base_url), "--journal", str(journal_path)]
    )
    assert "Traceback" not in result.output, result.output
    with JournalReader(journal_path) as reader:
        original = reader.get_request("replay-code-original")
        assert original is not None and original["error_code"] == "max_tokens_zero_not_relayed"
        replays = [r for r in reader.list_requests(1000, query="replay:yes") if r["replay_of"] == original["id"]]
    mine = [r for r in replays if r["backend"] == "replay"]
    assert len(mine) == 1 and mine[0]["status"] == 400
    assert mine[0]["error_code"] == "max_tokens_zero_not_relayed" and mine[0]["error_type"] == "invalid_request_error"


def _exchange(gateway: Spawned, *requests: bytes) -> list[bytes]:
    """Send raw requests on one connection; the raw answers (each read to its close or length)."""
    host, port = gateway.url.removeprefix("http://").split(":")
    answers = []
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        reader = conn.makefile("rb")
        for raw in requests:
            conn.sendall(raw)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                byte = reader.read(1)
                if not byte:
                    break
                head += byte
            length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE)[1])  # type: ignore[index]
            answers.append(head + reader.read(length))
    return answers


def test_a_request_sanic_refuses_while_reading_it_keeps_the_clients_id(
    gateway: Spawned, journal_path: Path
) -> None:
    bad_length = (
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-request-id: proto-refused-1\r\nContent-Length: abc\r\n\r\n"
    )
    (answer,) = _exchange(gateway, bad_length)
    assert answer.startswith(b"HTTP/1.1 400") and b"x-request-id: proto-refused-1" in answer
    assert b'"request_id":"proto-refused-1"' in answer
    events = wait_for_events(journal_path, "proto-refused-1")
    received = events[0]
    assert isinstance(received, Received) and received.client_request_id == "proto-refused-1"
    assert received.method == "POST" and received.headers["content-length"] == "abc"


def test_a_broken_request_after_a_good_one_does_not_take_its_id(gateway: Spawned) -> None:
    first = b"GET /v1/messages HTTP/1.1\r\nHost: x\r\nx-request-id: keep-alive-first\r\n\r\n"
    broken = b"NOT A REQUEST LINE\r\n\r\n"
    answers = _exchange(gateway, first, broken)
    assert b"x-request-id: keep-alive-first" in answers[0]
    assert answers[1].startswith(b"HTTP/1.1 400") and b"keep-alive-first" not in answers[1]
