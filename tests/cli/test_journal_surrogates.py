"""`smg journal show` on text no terminal can print: a lone surrogate escape in a body, and
one in a stored payload (which strict JSON readers refuse)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
from typer.testing import CliRunner

from smg.cli.main import app
from tests.conftest import MODEL, Scripted, wait_for_events

runner = CliRunner()


def test_show_prints_a_body_holding_a_lone_surrogate_escape(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    raw = '{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": "lone \\ud800 x"}]}'
    client.post(
        "/v1/messages",
        content=(raw % MODEL).encode(),
        headers={"content-type": "application/json", "x-request-id": "surrogate-body"},
    )
    wait_for_events(journal_path, "surrogate-body")
    shown = runner.invoke(app, ["journal", "show", "surrogate-body", "-j", str(journal_path)])
    assert shown.exit_code == 0, shown.output
    assert "\\ud800" in shown.output
    as_json = runner.invoke(app, ["journal", "show", "surrogate-body", "-j", str(journal_path), "--json"])
    assert as_json.exit_code == 0, as_json.output


def test_show_reads_a_payload_with_a_lone_surrogate_escape(
    client: httpx.Client, scripted: Scripted, journal_path: Path, tmp_path: Path
) -> None:
    client.post("/v1/messages", json={"model": MODEL}, headers={"x-request-id": "surrogate-payload"})
    events = wait_for_events(journal_path, "surrogate-payload")
    assert events[-1].kind == "completed"
    copy = tmp_path / "copy.db"
    source = sqlite3.connect(journal_path)
    try:
        source.execute(f"VACUUM INTO '{copy}'")
    finally:
        source.close()
    # What the standard library writes for a string holding a lone surrogate.
    conn = sqlite3.connect(copy)
    try:
        (key,) = conn.execute("SELECT id FROM requests WHERE client_id = 'surrogate-payload'").fetchone()
        data = json.dumps({"stage": "admission", "status": 400, "error_type": "x", "message": "bad \ud800 byte"})
        assert "\\ud800" in data
        conn.execute(
            "UPDATE events SET data = ? WHERE rk = (SELECT rk FROM requests WHERE id = ?) AND kind = 'error'",
            (data, key),
        )
        conn.commit()
    finally:
        conn.close()
    for args in (["show", key], ["show", key, "--json"], ["export", key, "--as", "json"], ["ls", "--json"]):
        result = runner.invoke(app, ["journal", *args, "-j", str(copy)])
        assert result.exit_code == 0, (args, result.output)
    assert "\\ud800" in runner.invoke(app, ["journal", "show", key, "-j", str(copy)]).output
