"""Spend through the Anthropic API upstream: a request refused (by validation, or by the API
itself) records the model it asked for, and a stream cut after `message_start` (the upstream
hangs up, or the client does) records the input tokens the API announced."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from journal.reader import JournalReader
from tests.anthropic.test_backend import CLIENT_HEADERS, MODEL
from tests.conftest import Scripted, wait_for_events
from tools import anthropic_answers as answers


def _row(journal: Path, request_id: str) -> dict[str, object]:
    wait_for_events(journal, request_id)
    with JournalReader(journal) as reader:
        row = reader.get_request(request_id)
    assert row is not None
    return row


@pytest.mark.parametrize("cut", ["upstream-dropped", "client-gone"])
def test_a_stream_cut_after_message_start_records_the_input_tokens_it_announced(
    api: httpx.Client, scripted: Scripted, anthropic_journal: Path, cut: str
) -> None:
    msg = answers.message(answers.text("a partial answer"), model=MODEL, usage=(4321, 50))
    # message_start (announcing 4321 input tokens), content_block_start, the first delta:
    scripted.script(answers.sse_answer(msg, **{"drop_after" if cut == "upstream-dropped" else "hold_after": 3}))
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "cut"}]}
    with api.stream("POST", "/v1/messages", json=body, headers=CLIENT_HEADERS) as reply:
        request_id = reply.headers["x-request-id"]
        for line in reply.iter_lines():
            if line.startswith("event: content_block_delta"):
                break
    row = _row(anthropic_journal, request_id)
    if cut == "client-gone":
        scripted.release()
    assert row["input_tokens"] == 4321 and row["model"] == MODEL


def test_a_request_the_api_refuses_records_the_model_it_asked_for(
    api: httpx.Client, scripted: Scripted, anthropic_journal: Path
) -> None:
    scripted.script(answers.error_answer(429, "rate_limit_error", "slow down"))
    body = {"model": "claude-refused-by-the-api", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    refused = api.post("/v1/messages", json=body, headers=CLIENT_HEADERS)
    assert refused.status_code == 429
    row = _row(anthropic_journal, refused.headers["x-request-id"])
    assert row["model"] == "claude-refused-by-the-api" and row["status"] == 429


def test_a_request_refused_by_validation_records_the_model_it_asked_for(
    api: httpx.Client, anthropic_journal: Path
) -> None:
    refused = api.post("/v1/messages", json={"model": "claude-no-messages", "max_tokens": 8}, headers=CLIENT_HEADERS)
    assert refused.status_code == 400
    row = _row(anthropic_journal, refused.headers["x-request-id"])
    assert row["model"] == "claude-no-messages" and row["status"] == 400
