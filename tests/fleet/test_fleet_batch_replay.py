"""`smg replay QUERY --to URL -j postgresql://…`: a batch replay read from the fleet journal.

Real traffic through a gateway relaying to the scripted worker, shipped to a real PostgreSQL by
the shipper; the query is run on the fleet journal against a scripted candidate. The command
writes nothing to the fleet journal (its replicas' shippers do), and the candidate gets each
request marked as a replay of its original.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from journal.pg import schema
from journal.pg.read import PostgresReader
from journal.redact import SECRET_ENV, SECRET_FILE
from journal.store import shown
from smg.cli.main import app
from tests.conftest import MODEL, Scripted, wait_for_events
from tests.fleet.test_fleet_read import ship_all
from tools.spawn import Spawned, spawn_gateway, spawn_worker

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def candidate() -> Iterator[Spawned]:
    proc = spawn_worker(models=[MODEL])
    try:
        yield proc
    finally:
        proc.stop()


def test_a_query_on_the_fleet_journal_is_replayed_in_aggregate(
    worker: Spawned, candidate: Spawned, pg_url: str, tmp_path: Path
) -> None:
    journal = tmp_path / "smg-journal.db"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema.migrate(conn)
    Scripted(worker.url).reset()
    gateway = spawn_gateway([worker.url], journal=journal, extra=["--disable-retries"])
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            for name, word in (("p1", "okapi"), ("p2", "okapi"), ("p3", "okapi"), ("p4", "heron")):
                body = {
                    "model": MODEL,
                    "max_tokens": 32,
                    "temperature": 0,
                    "stream": name == "p3",
                    "messages": [{"role": "user", "content": f"[{name}] hello {word}"}],
                }
                assert client.post("/v1/messages", json=body, headers={"x-request-id": name}).status_code == 200
    finally:
        gateway.stop()
    ids = {name: wait_for_events(journal, name)[0].request_id for name in ("p1", "p2", "p3", "p4")}  # type: ignore[attr-defined]
    ship_all(journal, pg_url)

    other = {"type": "message", "role": "assistant", "model": MODEL, "content": [{"type": "text", "text": "no"}]}
    other |= {"stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}
    Scripted(candidate.url).script({"when_body_contains": "[p2]", "json": other})
    report_path = tmp_path / "report.json"
    result = runner.invoke(
        app,
        ["replay", "okapi", "--to", candidate.url, "-j", pg_url, "--concurrency", "2", "--report", str(report_path)],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert (report["selected"], report["identical"], report["different"], report["failed"]) == (3, 2, 1, 0)
    assert report["different_by_kind"]["text"] == 1
    assert report["journal"] == shown(pg_url)
    received = Scripted(candidate.url).received()
    assert sorted(r["headers"]["x-smg-replay-of"] for r in received) == sorted(ids[n] for n in ("p1", "p2", "p3"))
    with PostgresReader(pg_url) as fleet:
        assert fleet.count("replay:yes") == 0 and fleet.count("") == 4


def test_a_secret_url_is_put_back_in_a_replay_read_from_the_fleet_journal(
    worker: Spawned, candidate: Spawned, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_url = "http://127.0.0.1:9/mcp?access_token=sk-url-secret"
    fleet_secret = "f" * 32  # the fleet's $SMG_TENANT_SECRET: its replicas key fingerprints with it
    journal = tmp_path / "smg-journal.db"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema.migrate(conn)
    gateway = spawn_gateway([worker.url], journal=journal, env={SECRET_ENV: fleet_secret})
    try:
        body = {
            "model": MODEL,
            "max_tokens": 32,
            "messages": [{"role": "user", "content": "[u1] hello ibis"}],
            "mcp_servers": [{"type": "url", "name": "files", "url": secret_url}],
        }
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            assert client.post("/v1/messages", json=body, headers={"x-request-id": "u1"}).status_code == 200
    finally:
        gateway.stop()
    original = wait_for_events(journal, "u1")[0].request_id  # type: ignore[attr-defined]
    ship_all(journal, pg_url)
    monkeypatch.setenv(SECRET_ENV, fleet_secret)
    (journal.parent / SECRET_FILE).unlink(missing_ok=True)  # the reader has the fleet's secret only
    for form in ([original], ["ibis", "--report", str(tmp_path / "report.json")]):
        Scripted(candidate.url).reset()
        result = runner.invoke(app, ["replay", *form, "--to", candidate.url, "-j", pg_url, "--secret-url", secret_url])
        assert result.exit_code == 0, result.output
        (sent,) = Scripted(candidate.url).received()
        assert sent["json"]["mcp_servers"][0]["url"] == secret_url, form
