"""Spend: a gateway with `--price-table` gives each completed request its cost in the journal,
`smg journal stats` sums it, a refused request still records the model it asked for, and a
relayed stream cut after `message_start` the input tokens it announced."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from journal.reader import JournalReader
from tests.conftest import MODEL, OTHER_MODEL, Scripted, wait_for_events
from tools import anthropic_answers as answers
from tools.spawn import Spawned, spawn_gateway

KEY = "sk-spend-test-key"
PRICES = f"""
[models."{MODEL}"]
input = 2.0
output = 10.0
cache_read = 0.5

[models."nothing-*"]
input = 1.0
"""


@pytest.fixture(scope="module")
def priced(worker: Spawned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Spawned, Path]]:
    root = tmp_path_factory.mktemp("spend")
    table = root / "prices.toml"
    table.write_text(PRICES)
    journal = root / "j.db"
    gateway = spawn_gateway(
        [worker.url], journal=journal, extra=["--api-key", KEY, "--disable-retries", "--price-table", str(table)]
    )
    try:
        yield gateway, journal
    finally:
        gateway.stop()


def _send(gateway: Spawned, model: str, *, key: str | None = KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "what does it cost"}]}
    return httpx.post(f"{gateway.url}/v1/messages", json=body, headers=headers, timeout=30.0)


def test_a_priced_request_has_its_cost_and_an_unpriced_one_none(
    priced: tuple[Spawned, Path], scripted: Scripted
) -> None:
    gateway, journal = priced
    usage = {"input_tokens": 1200, "output_tokens": 300, "cache_read_input_tokens": 4000}
    answer = {
        "id": "msg_spend",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "a lot"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
    scripted.script({"json": answer}, {"json": {**answer, "model": OTHER_MODEL}})
    paid = _send(gateway, MODEL)
    free = _send(gateway, OTHER_MODEL)
    assert paid.status_code == free.status_code == 200
    for response in (paid, free):
        wait_for_events(journal, response.headers["x-request-id"])
    with JournalReader(journal) as reader:
        paid_row = reader.get_request(paid.headers["x-request-id"])
        free_row = reader.get_request(free.headers["x-request-id"])
        numbers = reader.stats("")
    assert paid_row is not None and free_row is not None
    assert paid_row["cost_usd"] == pytest.approx((1200 * 2.0 + 300 * 10.0 + 4000 * 0.5) / 1_000_000)
    assert free_row["cost_usd"] is None  # no price for the model: no cost, not 0
    assert numbers["cost_usd"]["priced_requests"] >= 1
    shown = subprocess.run(
        [sys.executable, "-m", "smg", "journal", "stats", "-j", str(journal)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "cost $" in shown.stdout and "priced requests" in shown.stdout and "scanned" in shown.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "smg", "journal", "stats", "-j", str(journal), "--by", "model", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    by_model = {row["group"]: row for row in orjson.loads(listed.stdout)["rows"]}
    assert by_model[MODEL]["cost_usd"] == pytest.approx(paid_row["cost_usd"])
    assert by_model[OTHER_MODEL]["cost_usd"] is None


def test_a_refused_request_records_the_model_it_asked_for(priced: tuple[Spawned, Path]) -> None:
    gateway, journal = priced
    body = {"model": "claude-asked-for", "max_tokens": 16}  # no messages: refused by validation
    refused = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert refused.status_code == 400
    events = wait_for_events(journal, refused.headers["x-request-id"])
    assert "validated" not in [e.kind for e in events]
    with JournalReader(journal) as reader:
        row = reader.get_request(refused.headers["x-request-id"])
        assert [r["id"] for r in reader.list_requests(query="model:claude-asked-for")] == [row and row["id"]]
    assert row is not None and row["model"] == "claude-asked-for" and row["status"] == 400
    assert row["cost_usd"] is None
    # A caller the gateway does not know is refused before its body is read: no model to record.
    unknown = _send(gateway, "claude-asked-for", key="sk-wrong")
    assert unknown.status_code == 401


def test_a_price_table_that_is_not_one_stops_the_launch(tmp_path: Path) -> None:
    table = tmp_path / "prices.toml"
    table.write_text('[models."m"]\ninput = "three dollars"\n')
    launched = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--no-journal", "--price-table", str(table)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launched.returncode == 2
    assert str(table) in launched.stderr and "input must be a number of dollars" in launched.stderr


@pytest.mark.parametrize("cut", ["worker-dropped", "client-gone"])
def test_a_relayed_stream_cut_after_message_start_records_the_input_tokens_it_announced(
    priced: tuple[Spawned, Path], scripted: Scripted, cut: str
) -> None:
    gateway, journal = priced
    msg = answers.message(answers.text("a partial answer"), model=MODEL, usage=(1234, 50))
    # message_start (announcing 1234 input tokens), content_block_start, the first delta:
    scripted.script(answers.sse_answer(msg, **{"drop_after" if cut == "worker-dropped" else "hold_after": 3}))
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "cut me"}]}
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        with client.stream("POST", "/v1/messages", json=body, headers=headers) as reply:
            request_id = reply.headers["x-request-id"]
            for line in reply.iter_lines():
                if line.startswith("event: content_block_delta"):
                    break  # the client goes away here (or the worker already has)
    events = wait_for_events(journal, request_id)
    if cut == "client-gone":
        scripted.release()
    completed = events[-1]
    assert completed.kind == "completed"
    with JournalReader(journal) as reader:
        row = reader.get_request(request_id)
    assert row is not None and row["input_tokens"] == 1234 and row["model"] == MODEL
    assert row["cost_usd"] == pytest.approx((1234 * 2.0 + row["output_tokens"] * 10.0) / 1_000_000)
