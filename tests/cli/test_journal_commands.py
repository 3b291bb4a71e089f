"""`smg journal ls | show | export | stats` over a journal written by real traffic.

Two gateways write the same journal: one relays to the scripted HTTP worker (gateway key
required, so curl exports carry a credential), one serves a scripted gRPC engine. The module
sends JSON and SSE requests, a rejected body, an upstream error, an unauthenticated request,
gRPC text (buffered and streamed) and a gRPC count_tokens, then checks every command against
what the clients received and what the journal holds.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from smg.cli.main import app
from tests.conftest import MODEL, Scripted, wait_for_events
from tests.grpc.conftest import MODEL as GRPC_MODEL
from tests.grpc.conftest import QWEN3
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway

runner = CliRunner(env={"COLUMNS": "250"})
KEY = "smg-cli-gateway-key"
UPSTREAM_KEY = "sk-ant-cli-upstream"
AUTH = {"authorization": f"Bearer {KEY}", "x-api-key": UPSTREAM_KEY}
USER = [{"role": "user", "content": "for the journal commands"}]
BODY = {"model": MODEL, "max_tokens": 16, "messages": USER}
# A body no shell may mangle: quotes, expansions, backslashes, a newline, non-ASCII.
TRICKY = (
    f'{{"model": "{MODEL}", "max_tokens": 16,\n "messages": [{{"role": "user", "content": '
    '"it\'s $HOME `id` $(id) \\\\ \\"q\\" héllo ☃ %s !!"}]}'
)
# The fixture's own requests (the curl tests add more, with ids the gateway minted).
OURS = "id:x-* | id:g-*"


@dataclass
class Traffic:
    journal: Path
    http: Spawned
    grpc: Spawned
    responses: dict[str, httpx.Response] = field(default_factory=dict)
    sent: dict[str, bytes] = field(default_factory=dict)


@pytest.fixture(scope="module")
def traffic(worker: Spawned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    journal = tmp_path_factory.mktemp("cli-commands") / "smg-journal.db"
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", GRPC_MODEL])
    relay = grpc = None
    try:
        relay = spawn_gateway([worker.url], journal=journal, extra=["--disable-retries", "--api-key", KEY])
        grpc = spawn_gateway([engine.url], journal=journal, extra=["--model-path", str(QWEN3)])
        out = Traffic(journal, relay, grpc)
        scripted = Scripted(worker.url)
        scripted.reset()
        control = EngineControl(engine.url)
        control.reset()

        def post(gateway: Spawned, rid: str, path: str, body: bytes, headers: dict[str, str]) -> None:
            headers = {**headers, "content-type": "application/json", "x-request-id": rid}
            out.responses[rid] = httpx.post(gateway.url + path, content=body, headers=headers, timeout=30)
            out.sent[rid] = body
            wait_for_events(journal, rid)

        msgs = "/v1/messages"
        post(relay, "x-json", msgs, json.dumps(BODY).encode(), AUTH)
        post(relay, "x-sse", msgs, json.dumps({**BODY, "stream": True}).encode(), AUTH)
        post(relay, "x-tricky", msgs, TRICKY.encode(), AUTH)
        post(relay, "x-bad", msgs, json.dumps({"model": MODEL}).encode(), AUTH)
        post(relay, "x-noauth", msgs, json.dumps(BODY).encode(), {})
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy, try later"}}
        scripted.script({"status": 529, "json": error})
        post(relay, "x-overloaded", msgs, json.dumps(BODY).encode(), AUTH)
        control.script({"text": "Hello there, friend."}, {"text": "Hello again, streamed."})
        grpc_body = {"model": GRPC_MODEL, "max_tokens": 64, "messages": USER}
        post(grpc, "g-text", msgs, json.dumps(grpc_body).encode(), {})
        post(grpc, "g-sse", msgs, json.dumps({**grpc_body, "stream": True}).encode(), {})
        count_body = {"model": GRPC_MODEL, "messages": USER}
        post(grpc, "g-count", "/v1/messages/count_tokens", json.dumps(count_body).encode(), {})
        control.close()
        yield out
    finally:
        for proc in (grpc, relay, engine):
            if proc is not None:
                proc.stop()


def cli(*args: str) -> Result:
    return runner.invoke(app, ["journal", *args])


def cli_json(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rows(traffic: Traffic, query: str = "", *extra: str) -> list[dict[str, Any]]:
    args = ["ls", *([query] if query else []), "-j", str(traffic.journal), "--limit", "1000", *extra]
    out: list[dict[str, Any]] = cli_json(*args)
    return out


# -- ls ------------------------------------------------------------------------------------


def test_traffic_answers_as_scripted(traffic: Traffic) -> None:
    codes = {rid: r.status_code for rid, r in traffic.responses.items()}
    assert codes == {
        "x-json": 200,
        "x-sse": 200,
        "x-tricky": 200,
        "x-bad": 400,
        "x-noauth": 401,
        "x-overloaded": 529,
        "g-text": 200,
        "g-sse": 200,
        "g-count": 200,
    }


def test_ls_json_lists_every_request_with_its_id(traffic: Traffic) -> None:
    listed = rows(traffic, OURS)
    assert {r["client_id"] for r in listed} == set(traffic.responses)
    assert [r["ts"] for r in listed] == sorted((r["ts"] for r in listed), reverse=True)
    by_id = {r["client_id"]: r for r in listed}
    assert by_id["x-json"]["backend"] == "http" and by_id["x-json"]["model"] == MODEL
    assert by_id["g-text"]["backend"] == "grpc" and by_id["g-text"]["output_tokens"] > 0
    assert by_id["g-count"]["path"] == "/v1/messages/count_tokens"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("backend:grpc", {"g-text", "g-sse", "g-count"}),
        ("status:4xx", {"x-bad", "x-noauth"}),
        ("status:>=500 | code:invalid_api_key", {"x-overloaded", "x-noauth"}),
        ("path:*count_tokens", {"g-count"}),
        ("model:qwen* !path:*count_tokens stream:yes", {"g-sse"}),
        ('"Hello there, friend."', {"g-text"}),
        ("id:x- has:error", {"x-bad", "x-noauth", "x-overloaded"}),
    ],
)
def test_ls_query(traffic: Traffic, query: str, expected: set[str]) -> None:
    assert {r["client_id"] for r in rows(traffic, query)} == expected


def test_ls_sorts_by_any_column_and_limits(traffic: Traffic) -> None:
    ascending = rows(traffic, "", "--sort", "duration_ms", "--asc")
    durations = [r["duration_ms"] for r in ascending]
    assert durations == sorted(durations) and len(durations) >= len(traffic.responses)
    by_tokens = rows(traffic, "out:>0", "--sort", "output_tokens")
    assert [r["output_tokens"] for r in by_tokens] == sorted((r["output_tokens"] for r in by_tokens), reverse=True)
    newest = cli_json("ls", "-j", str(traffic.journal), "-n", "2")
    assert [r["id"] for r in newest] == [r["id"] for r in rows(traffic)[:2]]
    skipped = cli_json("ls", "-j", str(traffic.journal), "-n", "2", "--offset", "2")
    assert [r["id"] for r in skipped] == [r["id"] for r in rows(traffic)[2:4]]


def test_ls_table(traffic: Traffic) -> None:
    result = cli("ls", "backend:http status:200", "-j", str(traffic.journal))
    assert result.exit_code == 0, result.output
    assert "3 requests matching 'backend:http status:200'" in result.output
    for rid in ("x-json", "x-sse", "x-tricky"):
        assert rid in result.output
    assert "g-text" not in result.output


def test_ls_refuses_a_bad_query_or_sort_cleanly(traffic: Traffic) -> None:
    bad = cli("ls", "status:abc", "-j", str(traffic.journal))
    assert bad.exit_code == 2
    assert "bad query" in bad.output and "expected a number" in bad.output and "Traceback" not in bad.output
    unknown = cli("ls", "colour:red", "-j", str(traffic.journal))
    assert unknown.exit_code == 2 and "unknown field" in unknown.output
    sort = cli("ls", "-j", str(traffic.journal), "--sort", "colour")
    assert sort.exit_code == 2 and "no column 'colour'" in sort.output


def test_missing_journal_fails_cleanly(tmp_path: Path) -> None:
    for args in (["ls"], ["stats"], ["show", "x"], ["export", "x"]):
        result = cli(*args, "-j", str(tmp_path / "nope.db"))
        assert result.exit_code == 1 and "no journal at" in result.output


def test_journal_defaults_to_the_environment(traffic: Traffic) -> None:
    result = runner.invoke(app, ["journal", "ls", OURS, "--json"], env={"SMG_JOURNAL": str(traffic.journal)})
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == len(traffic.responses)


# -- show ----------------------------------------------------------------------------------


def test_show_renders_engine_events(traffic: Traffic) -> None:
    result = cli("show", "g-sse", "-j", str(traffic.journal))
    assert result.exit_code == 0, result.output
    for text in ("rendered", "prompt_tokens=", "tokenizer=", "eos=", "tokens", "Σ", "completion="):
        assert text in result.output, text
    assert "event: message_stop" in result.output  # the SSE text as the client got it

    counted = cli("show", "g-count", "-j", str(traffic.journal))
    assert counted.exit_code == 0, counted.output
    n = traffic.responses["g-count"].json()["input_tokens"]
    assert f"input_tokens={n}" in counted.output and "no engine call" in counted.output


def test_show_json_is_the_json_export_with_the_answer_and_the_waterfall(traffic: Traffic) -> None:
    shown = cli_json("show", "g-count", "-j", str(traffic.journal))
    exported = json.loads(cli("export", "g-count", "-j", str(traffic.journal), "--as", "json").stdout)
    assert {k: v for k, v in shown.items() if k not in ("answer", "waterfall")} == exported
    assert shown["answer"]["status"] == 200 and "render + tokenize" in [s["name"] for s in shown["waterfall"]]
    kinds = ["received", "validated", "routed", "rendered", "counted", "completed"]
    assert [e["kind"] for e in shown["events"]] == kinds
    assert json.loads(shown["response"]["body"]) == traffic.responses["g-count"].json()


# -- export --------------------------------------------------------------------------------


def run_curl(command: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run an exported curl command with `bash -c`; returns (status, body, x-request-id).

    A command too long for one exec argument (Linux caps one at 128 KiB) goes in on stdin
    instead, as if pasted into a terminal.
    """
    script = command.rstrip("\n") + " -w '\\n%{http_code} %header{x-request-id}'\n"
    long = len(script.encode()) > 100_000
    done = subprocess.run(
        ["bash", "-s"] if long else ["bash", "-c", script],
        input=script if long else None,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    body, _, tail = done.stdout.rpartition("\n")
    code, _, request_id = tail.partition(" ")
    return int(code), body, request_id


def export_curl(traffic: Traffic, rid: str, gateway: Spawned) -> str:
    result = cli("export", rid, "-j", str(traffic.journal), "--as", "curl", "--url", gateway.url)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_curl_export_uses_key_placeholders_never_fingerprints(traffic: Traffic) -> None:
    command = export_curl(traffic, "x-json", traffic.http)
    assert command.startswith("curl ") and f"{traffic.http.url}/v1/messages" in command
    assert '"authorization: Bearer ${SMG_API_KEY}"' in command
    assert '"x-api-key: ${ANTHROPIC_API_KEY}"' in command
    assert "redacted" not in command and KEY not in command and UPSTREAM_KEY not in command
    assert "x-request-id" not in command and "content-length" not in command and "host:" not in command


def test_curl_export_reproduces_the_request(traffic: Traffic) -> None:
    command = export_curl(traffic, "x-json", traffic.http)
    status, body, new_id = run_curl(command, {"SMG_API_KEY": KEY, "ANTHROPIC_API_KEY": UPSTREAM_KEY})
    assert status == 200, body
    assert json.loads(body)["content"] == traffic.responses["x-json"].json()["content"]
    assert new_id and new_id != "x-json"
    again = wait_for_events(traffic.journal, new_id)[0]
    original = wait_for_events(traffic.journal, "x-json")[0]
    assert again.body == original.body  # type: ignore[attr-defined]
    assert again.headers["authorization"] == original.headers["authorization"]  # type: ignore[attr-defined]
    assert again.headers["x-api-key"] == original.headers["x-api-key"]  # type: ignore[attr-defined]

    # The key really comes from the variable: a wrong one is refused.
    status, _, _ = run_curl(command, {"SMG_API_KEY": "wrong", "ANTHROPIC_API_KEY": UPSTREAM_KEY})
    assert status == 401


def test_curl_export_survives_shell_quoting(traffic: Traffic) -> None:
    status, body, new_id = run_curl(
        export_curl(traffic, "x-tricky", traffic.http), {"SMG_API_KEY": KEY, "ANTHROPIC_API_KEY": UPSTREAM_KEY}
    )
    assert status == 200, body
    received = wait_for_events(traffic.journal, new_id)[0]
    assert received.body == TRICKY  # type: ignore[attr-defined]
    assert json.loads(body)["content"] == traffic.responses["x-tricky"].json()["content"]


def test_curl_export_of_a_large_body(traffic: Traffic) -> None:
    # Over the 128 KiB a single exec argument may hold: the command pipes the body instead.
    big = json.dumps({**BODY, "messages": [{"role": "user", "content": "x' $y " * 30_000}]})
    response = httpx.post(
        traffic.http.url + "/v1/messages",
        content=big,
        headers={**AUTH, "content-type": "application/json", "x-request-id": "big-1"},
        timeout=30,
    )
    assert response.status_code == 200
    wait_for_events(traffic.journal, "big-1")
    command = export_curl(traffic, "big-1", traffic.http)
    assert command.startswith("printf '%s' ") and "--data-binary @-" in command
    status, body, new_id = run_curl(command, {"SMG_API_KEY": KEY, "ANTHROPIC_API_KEY": UPSTREAM_KEY})
    assert status == 200, body
    assert wait_for_events(traffic.journal, new_id)[0].body == big  # type: ignore[attr-defined]


def test_curl_export_of_a_stream_and_a_grpc_count(traffic: Traffic) -> None:
    command = export_curl(traffic, "x-sse", traffic.http)
    assert command.startswith("curl -sS -N")
    status, body, _ = run_curl(command, {"SMG_API_KEY": KEY, "ANTHROPIC_API_KEY": UPSTREAM_KEY})
    assert status == 200 and body.startswith("event: message_start") and "event: message_stop" in body

    status, body, _ = run_curl(export_curl(traffic, "g-count", traffic.grpc), {})
    assert status == 200 and json.loads(body) == traffic.responses["g-count"].json()


@pytest.mark.parametrize("rid", ["x-json", "x-sse", "x-bad", "x-overloaded", "g-text", "g-sse", "g-count"])
def test_json_export_has_the_response_as_received(traffic: Traffic, rid: str) -> None:
    doc = json.loads(cli("export", rid, "-j", str(traffic.journal), "--as", "json").stdout)
    assert doc["request"]["client_id"] == rid
    times = [e["t"] for e in doc["events"]]
    assert times == sorted(times) and doc["events"][0]["kind"] == "received"
    assert doc["events"][-1]["kind"] == "completed"
    client = traffic.responses[rid]
    response = doc["response"]
    assert response["status"] == client.status_code and response["encoding"] == "utf-8"
    assert response["body"] == client.text
    assert response["streamed"] == client.headers["content-type"].startswith("text/event-stream")
    assert response["headers"]["x-request-id"] == rid


@pytest.mark.parametrize("rid", ["x-json", "x-sse", "x-overloaded", "g-count"])
def test_har_export(traffic: Traffic, rid: str) -> None:
    result = cli("export", rid, "-j", str(traffic.journal), "--as", "har", "--url", "http://gw.example:8080/")
    assert result.exit_code == 0, result.output
    log = json.loads(result.stdout)["log"]
    assert log["version"] == "1.2" and log["creator"]["name"] == "smg"
    (entry,) = log["entries"]
    request, response = entry["request"], entry["response"]
    path = "/v1/messages/count_tokens" if rid == "g-count" else "/v1/messages"
    assert request["method"] == "POST" and request["url"] == "http://gw.example:8080" + path
    assert request["postData"]["text"] == traffic.sent[rid].decode()
    assert request["postData"]["mimeType"] == "application/json"
    assert request["bodySize"] == len(traffic.sent[rid])
    headers = {h["name"]: h["value"] for h in request["headers"]}
    if rid.startswith("x-"):
        assert headers["authorization"].startswith("[redacted sha256:")
    client = traffic.responses[rid]
    assert response["status"] == client.status_code
    assert response["statusText"] == {200: "OK", 529: ""}[client.status_code]
    assert response["content"]["text"] == client.text and response["content"]["size"] == len(client.content)
    assert response["content"]["mimeType"] == client.headers["content-type"]
    assert {h["name"]: h["value"] for h in response["headers"]}["x-request-id"] == rid
    summary = next(r for r in rows(traffic) if r["client_id"] == rid)
    timings = entry["timings"]
    assert entry["time"] == pytest.approx(summary["duration_ms"], abs=0.01)
    assert timings["send"] + timings["wait"] + timings["receive"] == pytest.approx(entry["time"], abs=0.01)
    assert 0 < timings["wait"] <= entry["time"]
    assert entry["startedDateTime"].endswith("+00:00")
    for key in ("cookies", "queryString", "headersSize", "httpVersion"):
        assert key in request
    for key in ("redirectURL", "headersSize", "bodySize", "cookies"):
        assert key in response


# -- stats ---------------------------------------------------------------------------------


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def counts(values: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[str(value)] = out.get(str(value), 0) + 1
    return out


@pytest.mark.parametrize("query", ["", OURS, "backend:http", "status:200"])
def test_stats_agree_with_the_rows(traffic: Traffic, query: str) -> None:
    listed = rows(traffic, query)
    stats = cli_json("stats", *([query] if query else []), "-j", str(traffic.journal))
    assert stats["requests"] == len(listed) and stats["completed"] == len(listed) and stats["in_flight"] == 0
    assert stats["errors"] == sum(1 for r in listed if r["status"] >= 400)
    assert stats["by_status_class"] == counts([f"{r['status'] // 100}xx" for r in listed])
    assert stats["by_status"] == counts([r["status"] for r in listed])
    assert stats["by_model"] == counts([r["model"] for r in listed if r["model"]])
    assert stats["by_backend"] == counts([r["backend"] for r in listed if r["backend"]])
    assert stats["stop_reasons"] == counts([r["stop_reason"] for r in listed if r["stop_reason"]])
    errors = [r["error_code"] or r["error_type"] or f"status {r['status']}" for r in listed if r["status"] >= 400]
    assert stats["error_codes"] == counts(errors)
    for key, column in (("duration", "duration_ms"), ("ttfe", "ttfe_ms")):
        values = [r[column] for r in listed if r[column] is not None]
        dist = stats["latency_ms"][key]
        assert dist["count"] == len(values)
        for p in (0.5, 0.9, 0.99):
            assert dist[f"p{round(p * 100)}"] == pytest.approx(nearest_rank(values, p))
        assert dist["max"] == pytest.approx(max(values)) and dist["mean"] == pytest.approx(sum(values) / len(values))
    tokens = stats["tokens"]
    assert tokens["input"] == sum(r["input_tokens"] or 0 for r in listed)
    assert tokens["output"] == sum(r["output_tokens"] or 0 for r in listed)
    rated = [r for r in listed if r["output_tokens"] is not None and r["duration_ms"] > 0]
    assert tokens["rated_requests"] == len(rated) > 0
    overall = sum(r["output_tokens"] for r in rated) * 1000 / sum(r["duration_ms"] for r in rated)
    assert tokens["output_per_s"] == pytest.approx(overall)
    median = nearest_rank([r["output_tokens"] * 1000 / r["duration_ms"] for r in rated], 0.5)
    assert tokens["output_per_s_median"] == pytest.approx(median)


def test_stats_of_the_whole_traffic(traffic: Traffic) -> None:
    stats = cli_json("stats", OURS, "-j", str(traffic.journal))
    assert stats["by_backend"] == {"http": 4, "grpc": 3}
    # A relayed upstream error has no `error` event, so its row has a status and no code.
    assert stats["error_codes"] == {"invalid_api_key": 1, "missing_field": 1, "overloaded_error": 1}
    assert stats["by_status_class"] == {"2xx": 6, "4xx": 2, "5xx": 1}


def test_stats_table_and_an_empty_selection(traffic: Traffic) -> None:
    result = cli("stats", OURS, "-j", str(traffic.journal))
    assert result.exit_code == 0, result.output
    for text in ("9 requests", "errors 3", "p50", "p99", "first event", "output tokens/s", "overloaded_error", "grpc"):
        assert text in result.output, text
    none = cli_json("stats", "model:no-such-model", "-j", str(traffic.journal))
    assert none["requests"] == 0 and none["latency_ms"]["duration"]["p50"] is None
    assert none["tokens"]["output_per_s"] is None
    assert cli("stats", "model:no-such-model", "-j", str(traffic.journal)).exit_code == 0
    bad = cli("stats", "(status:200", "-j", str(traffic.journal))
    assert bad.exit_code == 2 and "unclosed" in bad.output
