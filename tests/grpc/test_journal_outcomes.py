"""How a gRPC request that did not end normally reads in the journal: a stream the client
left (its output tokens), a stream that failed after it started (an error in `stats`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from journal.events import Completed
from journal.reader import JournalReader
from smg.cli.main import app
from tests.conftest import wait_for_events
from tests.grpc.conftest import MODEL
from tools.engine_control import EngineControl
from tools.spawn import Spawned

USER = [{"role": "user", "content": "Say hello."}]
runner = CliRunner()


def test_a_stream_the_client_left_records_the_tokens_it_produced(
    grpc_gateway: Spawned, control: EngineControl, grpc_journal: Path
) -> None:
    control.script({"text": "one two three four five six seven eight nine ten", "chunk_size": 1, "hold_after": 4})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True}
    deltas = 3  # tokens delivered before the client leaves ("one two three")
    text = ""
    try:
        with httpx.Client(base_url=grpc_gateway.url, timeout=10.0) as client:
            with client.stream("POST", "/v1/messages", json=body) as reply:
                request_id = reply.headers["x-request-id"]
                for line in reply.iter_lines():
                    if line.startswith("data:") and '"text_delta"' in line:
                        text += json.loads(line[5:])["delta"]["text"]
                    if "three" in text:
                        break  # the client goes away with three tokens delivered (in however many deltas)
        events = wait_for_events(grpc_journal, request_id)
    finally:
        control.release()
    completed = events[-1]
    assert isinstance(completed, Completed) and completed.disconnected
    assert completed.usage is not None and completed.usage["output_tokens"] >= deltas
    with JournalReader(grpc_journal) as reader:
        row = reader.get_request(request_id)
    assert row is not None and row["output_tokens"] >= deltas


def test_a_stream_that_failed_after_it_started_counts_as_an_error(
    http: httpx.Client, control: EngineControl, grpc_journal: Path
) -> None:
    error = {"code": "INTERNAL", "message": "oom", "after_tokens": 2}
    control.script({"text": "partial answer that breaks", "error": error})
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 32, "messages": USER, "stream": True})
    assert reply.status_code == 200 and "event: error" in reply.text
    request_id = reply.headers["x-request-id"]
    wait_for_events(grpc_journal, request_id)
    deadline = time.monotonic() + 10
    while True:
        result = runner.invoke(app, ["journal", "stats", f"id:{request_id}", "-j", str(grpc_journal), "--json"])
        assert result.exit_code == 0, result.output
        stats = json.loads(result.stdout)
        if stats["completed"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stats["requests"] == 1 and stats["errors"] == 1
    assert sum(stats["error_codes"].values()) == 1
    listed = runner.invoke(app, ["journal", "ls", f"has:error id:{request_id}", "-j", str(grpc_journal), "--json"])
    assert [r["id"] for r in json.loads(listed.stdout)] == [request_id]
