"""`smg journal ls` and `smg journal show` against a journal written by the test."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from journal.events import Block, Completed, Event, Received, Rejected, Routed, Validated
from journal.writer import JournalWriter
from smg.cli.journal import journal_app

SECRET = "sk-ant-CLI-SECRET"
WIDE = {"COLUMNS": "220"}


def ok_request() -> list[Event]:
    body = json.dumps({"model": "claude-x", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]})
    return [
        Received(
            method="POST",
            path="/v1/messages",
            headers={"x-api-key": SECRET, "content-type": "application/json"},
            body=body,
            ts=1_700_000_000.0,
        ),
        Validated(model="claude-x", stream=False, t=0.0002),
        Routed(backend="grpc", worker="grpc://127.0.0.1:5000", model="qwen3", t=0.0005),
        Block(
            event={
                "type": "message_start",
                "message": {
                    "id": "msg_01",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 11, "output_tokens": 1},
                },
            },
            t=0.012,
        ),
        Block(
            event={
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            t=0.0121,
        ),
        Block(
            event={
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hello there"},
            },
            t=0.013,
        ),
        Block(event={"type": "content_block_stop", "index": 0}, t=0.014),
        Block(
            event={
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 2},
            },
            t=0.015,
        ),
        Block(event={"type": "message_stop"}, t=0.0151),
        Completed(status=200, duration_ms=15.5, bytes_sent=400, t=0.0155),
    ]


def rejected_request() -> list[Event]:
    return [
        Received(method="POST", path="/v1/messages", body="{nope", ts=1_700_000_001.0),
        Rejected(
            status=400,
            error_type="invalid_request_error",
            message="body is not JSON",
            code="invalid_json",
            t=0.0001,
        ),
        Completed(status=400, duration_ms=0.3, bytes_sent=150, t=0.0003),
    ]


@pytest.fixture
def sample_journal(tmp_path: Path) -> Path:
    path = tmp_path / "smg-journal.db"

    async def write() -> None:
        writer = JournalWriter(path)
        await writer.start()
        for request_id, events in (
            ("req_0123456789ok", ok_request()),
            ("req_9876543210bad", rejected_request()),
        ):
            for seq, event in enumerate(events):
                await writer.append(request_id, seq, event)
        await writer.close()

    asyncio.run(write())
    return path


runner = CliRunner()


def test_ls_table(sample_journal: Path) -> None:
    result = runner.invoke(journal_app, ["ls", "--journal", str(sample_journal)], env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "req_0123456789ok" in out and "req_9876543210bad" in out
    assert out.index("req_9876543210bad") < out.index("req_0123456789ok")  # newest first
    for text in ("qwen3", "grpc", "end_turn", "11/2", "invalid_json", "400", "12ms"):
        assert text in out, text


def test_ls_json_and_limit(sample_journal: Path) -> None:
    result = runner.invoke(journal_app, ["ls", "-j", str(sample_journal), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["id"] for r in rows] == ["req_9876543210bad", "req_0123456789ok"]
    assert rows[1]["model"] == "qwen3" and rows[1]["output_tokens"] == 2
    assert rows[0]["error_code"] == "invalid_json" and rows[0]["status"] == 400
    limited = runner.invoke(journal_app, ["ls", "-j", str(sample_journal), "--json", "-n", "1"])
    assert len(json.loads(limited.stdout)) == 1


def test_journal_from_environment(sample_journal: Path) -> None:
    env = {**WIDE, "SMG_JOURNAL": str(sample_journal)}
    result = runner.invoke(journal_app, ["ls", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 2


def test_show_timeline_request_and_response(sample_journal: Path) -> None:
    result = runner.invoke(journal_app, ["show", "req_0123", "--journal", str(sample_journal)], env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "req_0123456789ok" in out
    for text in (
        "received",
        "validated",
        "routed",
        "message_start",
        "content_block_delta #0 text_delta 'Hello there'",
        "message_delta stop=end_turn",
        "completed",
        "12.0",  # relative time of message_start in ms
        "[redacted sha256:",
        '"max_tokens": 32',  # request body pretty-printed
    ):
        assert text in out, text
    assert SECRET not in out
    assert "HTTP 200" in out
    assert "Hello there" in out.split("response as the client received it")[1]


def test_show_json(sample_journal: Path) -> None:
    result = runner.invoke(journal_app, ["show", "req_98", "-j", str(sample_journal), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["request"]["id"] == "req_9876543210bad"
    assert [e["kind"] for e in data["events"]] == ["received", "rejected", "completed"]
    assert data["events"][1]["data"]["code"] == "invalid_json"


def test_show_when_the_response_cannot_be_rebuilt(sample_journal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(events: object) -> object:
        raise RuntimeError("projection bug")

    monkeypatch.setattr("smg.projection.reconstruct", broken)  # the timeline must still show
    result = runner.invoke(journal_app, ["show", "req_0123", "--journal", str(sample_journal)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "message_stop" in result.stdout
    assert "response view unavailable" in result.stdout


def test_show_errors(sample_journal: Path, tmp_path: Path) -> None:
    missing = runner.invoke(journal_app, ["show", "req_x", "-j", str(tmp_path / "none.db")])
    assert missing.exit_code == 1
    assert "no journal" in missing.output
    unknown = runner.invoke(journal_app, ["show", "req_x", "-j", str(sample_journal)])
    assert unknown.exit_code == 1
    assert "no request" in unknown.output
    ambiguous = runner.invoke(journal_app, ["show", "req_", "-j", str(sample_journal)])
    assert ambiguous.exit_code == 1
    assert "req_0123456789ok" in ambiguous.output
