"""Conversations, groups and exports over Claude Code-shaped traffic through a live gateway.

A gateway relays to the scripted worker; two clients talk to it the way Claude Code does (a
session header, `metadata.user_id`, a system prompt, the whole history resent each turn, a
W3C `traceparent`), and a third one without a session header resends its history too. Then
`thread`, `diff`, `stats --by/--every`, `export --as otlp|jsonl|har` and the search fields are
checked against what the clients sent and received.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from journal.reader import JournalReader
from smg.cli.main import app
from tests.conftest import MODEL, wait_for_events
from tools.spawn import spawn_gateway, spawn_worker

runner = CliRunner(env={"COLUMNS": "250"})
SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."
SESSION = "4f1c2f7e-3b7a-4c55-9d7e-1a2b3c4d5e6f"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TURNS = ["list the files in src", "now open parser.py", "fix the off-by-one in tokenize"]


def _turn(http: httpx.Client, url: str, history: list[dict[str, Any]], text: str, headers: dict[str, str]) -> str:
    history.append({"role": "user", "content": [{"type": "text", "text": text}]})
    body = {
        "model": MODEL,
        "max_tokens": 64,
        "system": [{"type": "text", "text": SYSTEM}],
        "metadata": {"user_id": "user_cc_42"},
        "messages": list(history),
    }
    response = http.post(f"{url}/v1/messages", json=body, headers=headers)
    assert response.status_code == 200, response.text
    history.append({"role": "assistant", "content": response.json()["content"]})
    return str(response.headers["x-request-id"])


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    path = tmp_path_factory.mktemp("conversations") / "j.db"
    worker = spawn_worker(models=[MODEL])
    try:
        gateway = spawn_gateway([worker.url], journal=path, extra=["--disable-retries"])
        try:
            out: dict[str, Any] = {"path": path, "session": [], "plain": []}
            with httpx.Client(timeout=30.0) as http:
                history: list[dict[str, Any]] = []
                for n, text in enumerate(TURNS):
                    headers = {
                        "x-claude-code-session-id": SESSION,
                        "x-api-key": "sk-ant-claude-code",
                        "traceparent": f"00-{TRACE}-{n + 1:016x}-01",
                    }
                    out["session"].append(_turn(http, gateway.url, history, text, headers))
                plain: list[dict[str, Any]] = []
                for text in ("what is 2+2", "and times 3"):
                    out["plain"].append(_turn(http, gateway.url, plain, text, {"x-api-key": "sk-ant-other"}))
            for request_id in out["session"] + out["plain"]:
                wait_for_events(path, request_id)
        finally:
            gateway.stop()  # its writer's last commit brings the text index and rollups up to date
    finally:
        worker.stop()
    yield out


def _cli(*args: str) -> Any:
    result = runner.invoke(app, ["journal", *args])
    assert result.exit_code == 0, result.output
    return result


def test_thread_follows_a_session_turn_by_turn(traffic: dict[str, Any]) -> None:
    path = str(traffic["path"])
    out = json.loads(_cli("thread", traffic["session"][1], "-j", path, "--json").output)
    assert [t["request"]["id"] for t in out] == traffic["session"]
    assert [t["messages"] for t in out] == [1, 3, 5]
    # Each turn added the previous answer and the user's next message.
    assert [len(t["added"]) for t in out] == [1, 2, 2]
    assert [t["added"][-1]["content"][0]["text"] for t in out] == TURNS
    assert not any(t["history_rewritten"] for t in out)
    shown = _cli("thread", traffic["session"][0], "-j", path).output
    assert "3 turns" in shown and "fix the off-by-one" in shown


def test_thread_without_a_session_header_follows_the_history(traffic: dict[str, Any]) -> None:
    out = json.loads(_cli("thread", traffic["plain"][-1], "-j", str(traffic["path"]), "--json").output)
    assert [t["request"]["id"] for t in out] == traffic["plain"]
    assert out[0]["request"]["thread_key"].startswith("h:")


def test_search_fields_come_from_the_headers_and_body(traffic: dict[str, Any]) -> None:
    with JournalReader(traffic["path"]) as reader:
        first = reader.get_request(traffic["session"][0])
        assert first is not None
        assert first["session_id"] == SESSION and first["trace_id"] == TRACE and first["user_id"] == "user_cc_42"
        assert reader.count(f"session:{SESSION}") == 3
        assert reader.count(f"trace:{TRACE}") == 3
        assert reader.count(f"key:{first['key_fp']}") == 3
        assert reader.count("user:user_cc_42") == 5
        assert reader.count('"off-by-one"') == 1  # only the turn that said it: history is not re-indexed
        assert reader.count("tokeniz") == 1  # a bare word is a prefix
        assert reader.count("hung_up:yes") == 0


def test_diff_shows_what_changed_between_two_turns(traffic: dict[str, Any]) -> None:
    a, b = traffic["session"][:2]
    out = json.loads(_cli("diff", a, b, "-j", str(traffic["path"]), "--json").output)
    paths = {d["path"] for d in out["request"]}
    assert "messages.length" in paths and "messages[0].content[0].text" not in paths
    assert any(d["path"] == "messages.length" and (d["left"], d["right"]) == (1, 3) for d in out["request"])
    same = json.loads(_cli("diff", a, a, "-j", str(traffic["path"]), "--json").output)
    assert same["request"] == same["response"] == same["summary"] == []


def test_stats_by_user_and_key(traffic: dict[str, Any]) -> None:
    path = str(traffic["path"])
    out = json.loads(_cli("stats", "-j", path, "--by", "key", "--json").output)
    assert sorted(r["requests"] for r in out["rows"]) == [2, 3]
    assert all(r["errors"] == 0 and r["latency_ms"]["count"] == r["requests"] for r in out["rows"])
    timed = json.loads(_cli("stats", "-j", path, "--by", "user", "--every", "1d", "--json").output)
    assert [(r["group"], r["requests"]) for r in timed["rows"]] == [("user_cc_42", 5)]
    assert timed["rows"][0]["bucket"] % 86400 == 0
    plot = _cli("stats", "-j", path, "--plot", "requests", "--every", "1h").output
    assert "requests every" in plot and "█" in plot


def test_export_a_query_as_otlp_jsonl_and_har(traffic: dict[str, Any]) -> None:
    path = str(traffic["path"])
    lines = _cli("export", f"session:{SESSION}", "--as", "otlp", "-j", path).output.splitlines()
    assert len(lines) == 3
    for n, line in enumerate(lines):
        spans = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        root = spans[0]
        assert root["traceId"] == TRACE and root["parentSpanId"] == f"{n + 1:016x}"  # under the client's span
        assert {s["name"] for s in spans[1:]} == {"validate", "route", "upstream"}
        assert all(s["parentSpanId"] == root["spanId"] for s in spans[1:])
        assert int(root["endTimeUnixNano"]) >= int(root["startTimeUnixNano"])
    jsonl = _cli("export", "user:user_cc_42", "--as", "jsonl", "-j", path).output
    records = [json.loads(line) for line in jsonl.splitlines()]
    assert [r["request"]["id"] for r in records] == traffic["session"] + traffic["plain"]
    har = json.loads(_cli("export", "key:*", "--as", "har", "-j", path).output)
    assert len(har["log"]["entries"]) == 5
    single = json.loads(_cli("export", traffic["plain"][0], "--as", "har", "-j", path).output)
    assert len(single["log"]["entries"]) == 1
    bad = runner.invoke(app, ["journal", "export", "nosuchfield:x", "--as", "jsonl", "-j", path])
    assert bad.exit_code == 2


def test_thread_of_an_unknown_request_fails(traffic: dict[str, Any], tmp_path: Path) -> None:
    result = runner.invoke(app, ["journal", "thread", "req_nope", "-j", str(traffic["path"])])
    assert result.exit_code == 1 and "no request" in result.output
