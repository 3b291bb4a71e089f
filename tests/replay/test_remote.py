"""`smg replay ID --to URL` against the gateway that served the original: same structure for
deterministic answers, the replay journaled with `replay_of`, the original's rows untouched."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from journal.events import Completed, Received
from journal.reader import JournalReader
from journal.redact import read_secret, redact_value
from journal.writer import JournalWriter
from replay.remote import ReplayError, body_to_send, forwarded_headers, replay_to
from smg.cli.main import app
from smg.projection import reconstruct
from tests.conftest import wait_for_events
from tests.replay.conftest import API_KEY, SCENARIOS
from tools.spawn import Spawned, free_port

runner = CliRunner(env={"COLUMNS": "200"})
DETERMINISTIC = [f"{s.name}-{mode}" for s in SCENARIOS if s.name != "sampled" for mode in ("plain", "stream")]
_REPLAY_ID = re.compile(r"journaled as (replay_\w+)")
_TARGET_ID = re.compile(r"the target's id (\w+)")


def snapshot(journal: Path, request_id: str) -> tuple[dict[str, Any] | None, list[Any]]:
    with JournalReader(journal) as reader:
        return reader.get_request(request_id), reader.raw_events(request_id)


def rows_replaying(journal: Path, original: str) -> list[dict[str, Any]]:
    with JournalReader(journal) as reader:
        return [r for r in reader.list_requests(limit=100_000) if r["replay_of"] == original]


def replay_cli(original: str, gateway: Spawned, journal: Path, *extra: str) -> Any:
    return runner.invoke(app, ["replay", original, "--to", gateway.url, "--journal", str(journal), *extra])


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_replay_to_the_same_gateway_is_structurally_identical(
    name: str, traffic: dict[str, str], gateway: Spawned, replay_journal: Path
) -> None:
    original = traffic[name]
    before = snapshot(replay_journal, original)
    result = replay_cli(original, gateway, replay_journal, "--api-key", API_KEY)
    assert result.exit_code == 0, result.output
    assert "identical" in result.output and "compared: structure, text" in result.output
    replay_id, target_id = _REPLAY_ID.search(result.output), _TARGET_ID.search(result.output)
    assert replay_id is not None and target_id is not None, result.output
    wait_for_events(replay_journal, target_id.group(1))

    rows = {r["id"]: r for r in rows_replaying(replay_journal, original)}
    assert replay_id.group(1) in rows  # the run as the CLI saw it
    mine = rows.pop(replay_id.group(1))
    assert mine["backend"] == "replay" and mine["status"] == 200 and mine["completed"]
    (theirs,) = rows.values()  # the run as the gateway served it
    assert theirs["id"] == target_id.group(1)
    assert theirs["backend"] == "grpc" and theirs["status"] == 200
    assert theirs["stop_reason"] == mine["stop_reason"] == before[0]["stop_reason"]  # type: ignore[index]
    assert snapshot(replay_journal, original) == before  # nothing written under the original's id


async def test_the_replay_run_is_journaled_as_sent_and_reconstructs(
    traffic: dict[str, str], gateway: Spawned, replay_journal: Path
) -> None:
    with JournalReader(replay_journal) as reader:
        events = [e for _, e in reader.events(traffic["tool-stream"])]
    result = await replay_to(events, gateway.url, {"authorization": f"Bearer {API_KEY}"}, replay_journal)
    assert result.identical and result.streamed and result.status == 200
    assert result.target_request_id and result.target_request_id != traffic["tool-stream"]
    with JournalReader(replay_journal) as reader:
        row = reader.get_request(result.replay_id)
        mine = [e for _, e in reader.events(result.replay_id)]
    theirs = wait_for_events(replay_journal, result.target_request_id)
    assert row is not None and row["replay_of"] == traffic["tool-stream"]
    assert [e.kind for e in mine][:4] == ["received", "validated", "routed", "upstream"]
    assert mine[-1].kind == "completed"
    received: Any = mine[0]
    # As sent: the operator's key (redacted by the writer), the marker, no request id of the original.
    key = read_secret(replay_journal)  # beside the journal: the gateway keyed its fingerprints with it
    assert key is not None
    assert received.headers["authorization"] == redact_value(f"Bearer {API_KEY}", key)
    assert received.headers["x-smg-replay-of"] == traffic["tool-stream"]
    assert "x-request-id" not in received.headers
    assert reconstruct(mine).body == result.body
    # The gateway saw the same: its row is marked too, under an id of its own.
    served: Any = theirs[0]
    assert served.headers["x-smg-replay-of"] == traffic["tool-stream"]
    assert served.headers["authorization"] == redact_value(f"Bearer {API_KEY}", key)


def test_secrets_come_from_the_operator_not_the_journal(
    traffic: dict[str, str], gateway: Spawned, replay_journal: Path
) -> None:
    result = replay_cli(traffic["text-plain"], gateway, replay_journal)
    assert result.exit_code == 1, result.output
    assert "status" in result.output and "401" in result.output and "authentication_error" in result.output
    replayed = _REPLAY_ID.search(result.output)
    assert replayed is not None
    with JournalReader(replay_journal) as reader:
        received: Any = reader.events(replayed.group(1))[0][1]
    assert "authorization" not in received.headers  # the recorded fingerprint was not sent


def test_a_sampled_request_compares_structure_only(
    traffic: dict[str, str], gateway: Spawned, replay_journal: Path
) -> None:
    result = replay_cli(traffic["sampled-stream"], gateway, replay_journal, "-H", f"Authorization: Bearer {API_KEY}")
    assert result.exit_code == 0, result.output
    assert "text not compared" in result.output and "compared: structure)" in result.output


def test_exact_also_compares_ids(traffic: dict[str, str], gateway: Spawned, replay_journal: Path) -> None:
    result = replay_cli(traffic["tool-plain"], gateway, replay_journal, "--api-key", API_KEY, "--exact")
    assert result.exit_code == 1, result.output
    fields = {line.split("│")[1].strip() for line in result.output.splitlines() if line.startswith("│")}
    assert {"id", "content[1].id"} <= fields
    assert not any(f.startswith(("content.kinds", "stop_reason", "usage", "content[0].text")) for f in fields)


def test_an_unreachable_target_is_reported_and_journaled(traffic: dict[str, str], replay_journal: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["replay", traffic["text-plain"], "--to", url, "--journal", str(replay_journal)])
    assert result.exit_code == 2, result.output
    assert "no answer" in result.output
    replayed = _REPLAY_ID.search(result.output)
    assert replayed is not None
    with JournalReader(replay_journal) as reader:
        row = reader.get_request(replayed.group(1))
    assert row is not None and row["replay_of"] == traffic["text-plain"]
    assert row["error_code"] == "call_upstream_connection_failed" and row["status"] == 502


# -- what is sent ------------------------------------------------------------------------


def test_forwarded_headers_drop_secrets_fingerprints_and_request_ids() -> None:
    recorded = {
        "authorization": "[redacted sha256:0123456789ab]",
        "x-api-key": "[redacted sha256:0123456789ab]",
        "cookie": "a=b",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "tools-2024",
        "x-request-id": "orig",
        "x-correlation-id": "orig",
        "x-request-id-shard": "7",
        "traceparent": "00-abc-def-01",
        "x-smg-mcp": "enabled",
        "user-agent": "sdk",
        "content-type": "application/json; charset=utf-8",
    }
    sent = forwarded_headers(recorded, {"Authorization": "Bearer mine"}, "orig")
    assert sent == {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "tools-2024",
        "x-request-id-shard": "7",
        "traceparent": "00-abc-def-01",
        "x-smg-mcp": "enabled",
        "content-type": "application/json; charset=utf-8",
        "authorization": "Bearer mine",
        "x-smg-replay-of": "orig",
    }


def test_redacted_mcp_tokens_must_be_supplied() -> None:
    token = redact_value("secret-token")
    body = (
        '{"model":"m","mcp_servers":[{"type":"url","name":"docs","url":"https://x",'
        f'"authorization_token":"{token}"}}],"max_tokens":5}}'
    )
    with pytest.raises(ReplayError, match="--mcp-token"):
        body_to_send(body)
    sent = body_to_send(body, {"docs": "secret-token"})
    assert sent == body.replace(token, "secret-token")
    assert body_to_send('{"model":"m"}') == '{"model":"m"}'


@pytest.mark.parametrize("name", ["count", "rejected", "zero"])
def test_answers_without_generation_replay_identically(
    name: str, traffic: dict[str, str], gateway: Spawned, replay_journal: Path
) -> None:
    result = replay_cli(traffic[name], gateway, replay_journal, "--api-key", API_KEY)
    assert result.exit_code == 0, result.output
    assert "identical" in result.output


async def test_d_compares_a_replayed_error_with_its_original_without_a_false_code(
    gateway: Spawned, replay_journal: Path
) -> None:
    """An error the gateway minted (404 `model_not_found`, with `X-SMG-Error-Code`) replayed to
    the same gateway gets the same answer: the inspector's `d` finds no difference."""
    import asyncio

    import httpx

    from replay.inspector import InspectorApp
    from replay.inspector.app import TextModal
    from tests.inspector.conftest import text

    body = {"model": "no-such-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {API_KEY}", "x-request-id": "rp-minted-error"}
    answer = httpx.post(f"{gateway.url}/v1/messages", json=body, headers=headers, timeout=30.0)
    assert answer.status_code == 404 and answer.headers["x-smg-error-code"] == "model_not_found"
    wait_for_events(replay_journal, "rp-minted-error")
    with JournalReader(replay_journal) as reader:
        original = str(reader.get_request("rp-minted-error")["id"])  # type: ignore[index]
    result = await asyncio.to_thread(replay_cli, original, gateway, replay_journal, "--api-key", API_KEY)
    assert result.exit_code == 0 and "identical" in result.output, result.output
    replay_id = _REPLAY_ID.search(result.output)
    assert replay_id is not None
    app = InspectorApp(replay_journal, refresh_s=0)
    async with app.run_test(size=(200, 50)) as pilot:
        app.open_request(replay_id.group(1))
        await pilot.pause()
        await pilot.press("d")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, TextModal)
        title = text(app.screen.query_one("#modal-title").content)  # type: ignore[attr-defined]
        body_text = text(app.screen.query_one("#modal-body").content)  # type: ignore[attr-defined]
        assert f"vs its original {original}: same" in title, body_text
        assert "error.code" not in body_text
SECRET_IMAGE = "https://img.example/a.png?sig=image-secret&w=1"
SECRET_MCP = "https://me:pw@mcp.example/sse"


def _url_body(*urls: str) -> str:
    content: list[Any] = [{"type": "image", "source": {"type": "url", "url": url}} for url in urls]
    return json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": content}]})


async def _record(journal: Path, request_id: str, body: str, secret: bytes | None = None) -> None:
    writer = JournalWriter(journal, secret=secret)
    await writer.start()
    await writer.append(request_id, 0, Received(method="POST", path="/v1/messages", body=body, ts=1.0))
    await writer.append(request_id, 1, Completed(status=200, duration_ms=1.0))
    await writer.close()


def test_a_url_whose_credentials_were_redacted_is_not_replayed_unless_supplied(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    body = _url_body(SECRET_IMAGE, SECRET_MCP)
    asyncio.run(_record(journal, "orig-url", body))

    with socket.socket() as target:  # the replay must not even connect
        target.bind(("127.0.0.1", 0))
        target.listen()
        target.setblocking(False)
        url = f"http://127.0.0.1:{target.getsockname()[1]}"
        result = runner.invoke(app, ["replay", "orig-url", "--to", url, "--journal", str(journal)])
        assert result.exit_code != 0
        assert "--secret-url" in result.output and "img.example/a.png?sig=[redacted" in result.output
        assert "mcp.example" in result.output
        with pytest.raises(BlockingIOError):
            target.accept()

    with JournalReader(journal) as reader:
        received = reader.events("orig-url")[0][1]
    assert isinstance(received, Received) and received.body is not None and "image-secret" not in received.body
    # Supplied as the client sent them, both go back in place: the body as the client sent it.
    assert body_to_send(received.body, secret_urls=[SECRET_MCP, SECRET_IMAGE]) == body
    with pytest.raises(ReplayError, match="mcp.example") as refused:
        body_to_send(received.body, secret_urls=[SECRET_IMAGE])
    assert "img.example" not in str(refused.value)


def test_a_url_redacted_with_the_journals_key_is_put_back_when_supplied(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    (tmp_path / "smg-tenant.key").write_bytes(b"k" * 32)  # as the gateway writing the file keeps it
    body = _url_body(SECRET_IMAGE)
    asyncio.run(_record(journal, "keyed-url", body, secret=read_secret(journal)))
    with JournalReader(journal) as reader:
        received = reader.events("keyed-url")[0][1]
    assert isinstance(received, Received) and received.body is not None and "image-secret" not in received.body
    with pytest.raises(ReplayError, match="img.example"):
        body_to_send(received.body, secret_urls=[SECRET_IMAGE])  # matched bare, it is not found
    assert body_to_send(received.body, secret_urls=[SECRET_IMAGE], key=read_secret(journal)) == body
