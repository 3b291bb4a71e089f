"""`smg journal ls` and `smg journal show` over a journal written by real traffic."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from smg.cli.main import app
from tests.conftest import MODEL, Scripted, wait_for_events

runner = CliRunner(env={"COLUMNS": "220"})
BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "for the cli"}]}


def test_ls_json_lists_real_requests(client: httpx.Client, scripted: Scripted, journal_path: Path) -> None:
    client.post("/v1/messages", json=BODY, headers={"x-request-id": "cli-ls-ok"})
    client.post("/v1/messages", json={"model": MODEL}, headers={"x-request-id": "cli-ls-bad"})
    wait_for_events(journal_path, "cli-ls-bad")
    result = runner.invoke(app, ["journal", "ls", "--journal", str(journal_path), "--json", "--limit", "500"])
    assert result.exit_code == 0, result.output
    rows = {row["client_id"]: row for row in json.loads(result.output)}
    assert rows["cli-ls-ok"]["status"] == 200 and rows["cli-ls-ok"]["model"] == MODEL
    assert rows["cli-ls-ok"]["backend"] == "http"
    assert rows["cli-ls-bad"]["status"] == 400 and rows["cli-ls-bad"]["error_type"] == "invalid_request_error"


def test_show_prints_timeline_request_and_response(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    response = client.post("/v1/messages", json=BODY, headers={"x-request-id": "cli-show-1", "x-api-key": "sk-hidden"})
    wait_for_events(journal_path, "cli-show-1")
    result = runner.invoke(app, ["journal", "show", "cli-show-1", "--journal", str(journal_path)])
    assert result.exit_code == 0, result.output
    for kind in ("received", "validated", "routed", "upstream", "completed"):
        assert kind in result.output
    assert "echo: for the cli" in result.output
    assert "sk-hidden" not in result.output
    as_json = runner.invoke(app, ["journal", "show", "cli-show-1", "--journal", str(journal_path), "--json"])
    shown = json.loads(as_json.output)
    assert [e["kind"] for e in shown["events"]][0] == "received"
    assert shown["response"]["status"] == 200
    assert response.json()["content"][0]["text"] == "echo: for the cli"


def test_show_unknown_id_fails_cleanly(journal_path: Path, client: httpx.Client) -> None:
    result = runner.invoke(app, ["journal", "show", "no-such-request", "--journal", str(journal_path)])
    assert result.exit_code != 0


def test_relayed_stream_usage_reaches_the_summary(client: httpx.Client, scripted: Scripted, journal_path: Path) -> None:
    with client.stream(
        "POST", "/v1/messages", json={**BODY, "stream": True}, headers={"x-request-id": "cli-usage-1"}
    ) as r:
        r.read()
    wait_for_events(journal_path, "cli-usage-1")
    result = runner.invoke(app, ["journal", "ls", "--journal", str(journal_path), "--json", "--limit", "500"])
    row = {row["client_id"]: row for row in json.loads(result.output)}["cli-usage-1"]
    assert row["stop_reason"] == "end_turn"
    assert row["output_tokens"] == 4 and row["input_tokens"] == 3  # "echo: for the cli"
