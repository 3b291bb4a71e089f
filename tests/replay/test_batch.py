"""`smg replay QUERY --to URL`: a whole query replayed against a candidate, told in aggregate.

The journal is recorded from real traffic (a gateway in front of a scripted worker, which
echoes). The candidate is another scripted worker, scripted per request by the prompt's
marker to answer like the original on some requests and otherwise on others: other text, a
tool call, another stop reason, other usage, an error status, a dropped connection, an answer
cut off, an answer too slow for `--timeout`. The report must count each kind exactly.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from journal.events import Completed, Received
from journal.reader import JournalReader
from journal.redact import read_secret
from journal.writer import JournalWriter
from replay.batch import difference_kinds, select, selection
from replay.diff import Difference, from_http
from replay.quantiles import Quantiles
from smg.cli.main import app
from smg.projection import reconstruct
from tests.conftest import Scripted, wait_for_events
from tools.spawn import Spawned, spawn_gateway, spawn_worker

runner = CliRunner(env={"COLUMNS": "200"})
MODEL = "scripted-model"
SELECTED = "zebra"  # every selected prompt has this word; the others do not
# name: streamed or not. What the candidate answers for each is in `candidate_script`.
TRAFFIC = {
    "r01": False,  # identical
    "r02": False,  # other text
    "r03": True,  # identical
    "r04": True,  # cut off after three events: failed (broke_off)
    "r05": True,  # other text, streamed
    "r06": False,  # a tool call: tool_calls and stop_reason
    "r07": False,  # another stop reason
    "r08": False,  # other usage
    "r09": False,  # 529 overloaded: status
    "r10": False,  # connection dropped: failed (connection)
    "r11": True,  # identical
    "r12": False,  # slower than --timeout: failed (timeout)
}
TIMEOUT_SECS = 2
# A URL whose credential the journal keeps only as a fingerprint, keyed with the journal's secret.
SECRET_URL = "http://127.0.0.1:9/doc.pdf?access_token=sk-url-secret"
MCP_SERVER = {"type": "url", "name": "docs", "url": "http://127.0.0.1:9/mcp", "authorization_token": "sk-mcp-secret"}
REPORT_KEYS = {
    "schema",
    "target",
    "query",
    "journal",
    "started_at",
    "finished_at",
    "interrupted",
    "options",
    "selected",
    "replayed",
    "identical",
    "different",
    "failed",
    "skipped",
    "text_compared",
    "different_by_kind",
    "failed_by_kind",
    "skipped_reasons",
    "latency_ms",
    "ttft_ms",
    "examples",
}


def _body(name: str, stream: bool, word: str = SELECTED) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 64,
        "temperature": 0,
        "stream": stream,
        "messages": [{"role": "user", "content": f"[{name}] hello {word}"}],
    }


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The journal and the gateway's ids of the recorded requests by name (`other1`, `other2`:
    two the query does not select)."""
    journal = tmp_path_factory.mktemp("batch-replay") / "smg-journal.db"
    worker = spawn_worker(models=[MODEL])
    try:
        gateway = spawn_gateway([worker.url], journal=journal, extra=["--disable-retries"])
        try:
            with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
                for name, stream in TRAFFIC.items():
                    response = client.post("/v1/messages", json=_body(name, stream), headers={"x-request-id": name})
                    assert response.status_code == 200, response.text
                for name in ("other1", "other2"):
                    response = client.post(
                        "/v1/messages", json=_body(name, False, "giraffe"), headers={"x-request-id": name}
                    )
                    assert response.status_code == 200
                # An MCP server's token: the journal keeps only its fingerprint.
                secret = _body("s1", False, "walrus") | {"mcp_servers": [MCP_SERVER]}
                assert client.post("/v1/messages", json=secret, headers={"x-request-id": "s1"}).status_code == 200
                files = {"type": "url", "name": "files", "url": SECRET_URL}
                url = _body("s2", False, "narwhal") | {"mcp_servers": [files]}
                assert client.post("/v1/messages", json=url, headers={"x-request-id": "s2"}).status_code == 200
            ids: dict[str, str] = {}
            for name in [*TRAFFIC, "other1", "other2", "s1", "s2"]:
                ids[name] = wait_for_events(journal, name)[0].request_id  # type: ignore[attr-defined]
        finally:
            gateway.stop()
    finally:
        worker.stop()
    yield journal, ids


@pytest.fixture
def candidate() -> Iterator[Spawned]:
    proc = spawn_worker(models=[MODEL])
    try:
        yield proc
    finally:
        proc.stop()


def _recorded_message(journal: Path, request_id: str) -> dict[str, Any]:
    with JournalReader(journal) as reader:
        rebuilt = reconstruct([e for _, e in reader.events(request_id)])
    message = from_http(rebuilt.status, rebuilt.headers, rebuilt.body).message
    assert message is not None
    return message


def _sse(message: dict[str, Any]) -> list[dict[str, Any]]:
    """`message` as a stream of one text block."""
    start = {**message, "content": [], "stop_reason": None}
    text = message["content"][0]["text"]
    frames = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"]}, "usage": message["usage"]},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [{"event": name, "data": data} for name, data in frames]


def candidate_script(journal: Path, ids: dict[str, str]) -> list[dict[str, Any]]:
    """The candidate's answers, keyed on each prompt's marker; the rest are echoed as the
    recording worker echoed them."""

    def like(name: str, **changes: Any) -> dict[str, Any]:
        return {**_recorded_message(journal, ids[name]), **changes}

    other_text = [{"type": "text", "text": "a different answer"}]
    r05 = like("r05", content=other_text)
    r06 = like("r06")
    r06["content"] = [*r06["content"], {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "z"}}]
    r06["stop_reason"] = "tool_use"
    r08 = like("r08")
    r08["usage"] = {**r08["usage"], "output_tokens": r08["usage"]["output_tokens"] + 3}
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    answers = {
        "r02": {"json": like("r02", content=other_text)},
        "r04": {"stream_echo": True, "drop_after": 3},
        "r05": {"sse": _sse(r05)},
        "r06": {"json": r06},
        "r07": {"json": like("r07", stop_reason="max_tokens")},
        "r08": {"json": r08},
        "r09": {"status": 529, "json": overloaded},
        "r10": {"drop": True},
        "r12": {"delay_ms": (TIMEOUT_SECS + 2) * 1000},
    }
    return [{"when_body_contains": f"[{name}]", "repeat": True, **answer} for name, answer in answers.items()]


def _replay(journal: Path, query: str, url: str, *extra: str) -> Any:
    return runner.invoke(app, ["replay", query, "--to", url, "--journal", str(journal), *extra])


def _replays_of(journal: Path, originals: set[str]) -> list[dict[str, Any]]:
    with JournalReader(journal) as reader:
        rows = reader.list_requests(10_000, query="replay:yes", descending=False)
    return [r for r in rows if r["replay_of"] in originals]


def test_a_query_replayed_against_a_candidate_counts_each_kind(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned, tmp_path: Path
) -> None:
    journal, ids = recorded
    Scripted(candidate.url).script(*candidate_script(journal, ids))
    report_path = tmp_path / "report.json"
    result = _replay(
        journal,
        SELECTED,
        candidate.url,
        "--concurrency",
        "4",
        "--timeout",
        str(TIMEOUT_SECS),
        "--report",
        str(report_path),
        "--fail-on-diff",
    )
    assert result.exit_code == 1, result.output
    report = json.loads(report_path.read_text())
    assert report["schema"] == "smg.replay.batch/1" and set(report) == REPORT_KEYS
    assert report["options"] == {"concurrency": 4, "rate": None, "timeout": 2.0, "exact": False, "text": None}
    assert set(report["examples"]) == {"different", "failed", "skipped"}
    assert report["query"] == SELECTED and report["target"] == candidate.url
    assert (report["selected"], report["replayed"], report["skipped"]) == (12, 12, 0)
    assert (report["identical"], report["different"], report["failed"]) == (3, 6, 3)
    assert report["different_by_kind"] == {
        "text": 2,
        "tool_calls": 1,
        "stop_reason": 2,
        "status": 1,
        "usage": 1,
        "other": 0,
    }
    assert report["failed_by_kind"] == {"connection": 1, "timeout": 1, "broke_off": 1}
    assert report["text_compared"] == 9  # every whole answer: the requests decode greedily
    names = {v: k for k, v in ids.items()}
    examples = report["examples"]
    assert sorted(names[e["id"]] for e in examples["different"]["text"]) == ["r02", "r05"]
    assert [names[e["id"]] for e in examples["different"]["tool_calls"]] == ["r06"]
    assert [names[e["id"]] for e in examples["different"]["status"]] == ["r09"]
    assert [names[e["id"]] for e in examples["failed"]["connection"]] == ["r10"]
    assert [names[e["id"]] for e in examples["failed"]["broke_off"]] == ["r04"]
    assert [names[e["id"]] for e in examples["failed"]["timeout"]] == ["r12"]
    # Latencies: the recorded ones of every replayed request, the candidate's of every whole answer.
    assert report["latency_ms"]["recorded"]["count"] == 12
    assert report["latency_ms"]["candidate"]["count"] == 9
    assert report["ttft_ms"]["candidate"]["count"] == 9
    for side in ("recorded", "candidate"):
        summary = report["latency_ms"][side]
        assert 0 <= summary["p50"] <= summary["p90"] <= summary["p99"] <= summary["max"]
    # The text summary says the same.
    assert "3 identical" in result.output and "6 different" in result.output and "3 failed" in result.output
    assert "tool_calls 1" in result.output and "connection 1" in result.output
    # Each run is journaled with a link to its original; nothing outside the query was sent.
    selected = {ids[name] for name in TRAFFIC}
    runs = _replays_of(journal, selected | {ids["other1"], ids["other2"]})
    assert sorted(r["replay_of"] for r in runs) == sorted(selected)
    assert all(r["backend"] == "replay" for r in runs)
    received = Scripted(candidate.url).received()
    assert len(received) == 12 and not any("giraffe" in r["body"] for r in received)


def test_without_fail_on_diff_a_batch_that_ran_exits_0(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned
) -> None:
    journal, ids = recorded
    Scripted(candidate.url).script(*candidate_script(journal, ids))
    result = _replay(journal, f"{SELECTED} !stream:yes", candidate.url, "--concurrency", "2", "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert "replayed 8 of 8" in result.output


def test_concurrency_is_the_candidates_most_in_flight(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned
) -> None:
    journal, _ = recorded
    # Every answer held long enough that the next ones arrive while it is still in flight.
    Scripted(candidate.url).script({"when_body_contains": SELECTED, "delay_ms": 300, "repeat": True})
    result = _replay(journal, SELECTED, candidate.url, "--concurrency", "3", "--fail-on-diff")
    assert result.exit_code == 0, result.output
    assert "12 identical" in result.output
    counts = httpx.get(f"{candidate.url}/_in_flight").json()
    assert counts["max"] == 3
    assert max(r["in_flight"] for r in Scripted(candidate.url).received()) == 3


def test_rate_spaces_the_starts_and_keeps_the_selection_order(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned
) -> None:
    journal, ids = recorded
    rate = 20.0
    selected = [ids[name] for name in TRAFFIC]  # recorded in this order
    before = {r["id"] for r in _replays_of(journal, set(selected))}
    result = _replay(journal, SELECTED, candidate.url, "--concurrency", "4", "--rate", str(rate))
    assert result.exit_code == 0, result.output
    runs = [r for r in _replays_of(journal, set(selected)) if r["id"] not in before]
    assert [r["replay_of"] for r in runs] == selected  # started oldest first
    starts = [r["ts"] for r in runs]  # when the batch started each (`received`'s time)
    # Each start at least 1/rate after the one before (a float's rounding allowed for).
    assert all(b - a >= 1 / rate - 1e-6 for a, b in zip(starts, starts[1:], strict=False)), starts
    # At the candidate: twelve arrivals span at least eleven gaps (less the first one's set-up).
    arrivals = [r["time"] for r in Scripted(candidate.url).received()]
    assert arrivals[-1] - arrivals[0] >= (len(arrivals) - 1) / rate - 0.05, arrivals


def test_one_id_keeps_the_single_form_unless_a_batch_flag_is_given(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned, tmp_path: Path
) -> None:
    journal, ids = recorded
    Scripted(candidate.url).script(*candidate_script(journal, ids))
    single = _replay(journal, ids["r02"], candidate.url)
    assert single.exit_code == 1, single.output
    assert "difference(s)" in single.output and "content[0].text" in single.output
    report_path = tmp_path / "one.json"
    batch = _replay(journal, ids["r02"], candidate.url, "--report", str(report_path))
    assert batch.exit_code == 0, batch.output
    report = json.loads(report_path.read_text())
    assert (report["selected"], report["different"], report["different_by_kind"]["text"]) == (1, 1, 1)
    assert _replay(journal, ids["r02"], candidate.url, "--fail-on-diff").exit_code == 1


def test_a_request_whose_secret_nobody_supplied_is_skipped_and_counted(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned, tmp_path: Path
) -> None:
    journal, ids = recorded
    report_path = tmp_path / "skipped.json"
    result = _replay(journal, "walrus", candidate.url, "--report", str(report_path), "--fail-on-diff")
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert (report["selected"], report["replayed"], report["skipped"]) == (1, 0, 1)
    (reason,) = report["skipped_reasons"]
    assert "--mcp-token" in reason and "'docs'" in reason
    assert report["examples"]["skipped"] == [{"id": ids["s1"], "reason": reason}]
    assert "skipped 1" in result.output
    assert Scripted(candidate.url).received() == []  # never sent with a fingerprint for a token
    supplied = _replay(
        journal, "walrus", candidate.url, "--mcp-token", "docs=sk-mcp-secret", "--report", str(report_path)
    )
    assert supplied.exit_code == 0, supplied.output
    assert json.loads(report_path.read_text())["replayed"] == 1
    (sent,) = Scripted(candidate.url).received()
    assert sent["json"]["mcp_servers"][0]["authorization_token"] == "sk-mcp-secret"


def test_a_secret_url_supplied_is_put_back_in_a_keyed_journals_batch(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned, tmp_path: Path
) -> None:
    journal, ids = recorded
    assert read_secret(journal) is not None  # the gateway keyed the journal's fingerprints
    with JournalReader(journal) as reader:
        received = next(e for _, e in reader.events(ids["s2"]) if isinstance(e, Received))
    assert received.body is not None and "sk-url-secret" not in received.body
    report_path = tmp_path / "secret-url.json"
    result = _replay(journal, "narwhal", candidate.url, "--secret-url", SECRET_URL, "--report", str(report_path))
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert (report["selected"], report["replayed"], report["skipped"]) == (1, 1, 0), report["skipped_reasons"]
    (sent,) = Scripted(candidate.url).received()
    assert sent["json"]["mcp_servers"][0]["url"] == SECRET_URL


def test_ctrl_c_stops_the_batch_with_the_report_so_far(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned, tmp_path: Path
) -> None:
    """Interrupted while the second request is held by the candidate: the report says the first,
    the run of the second is closed in the journal (not left in flight), and the exit is 130."""
    journal, ids = recorded
    scripted = Scripted(candidate.url)
    scripted.script({"when_body_contains": "[r02]", "delay_ms": 600_000})
    report_path = tmp_path / "interrupted.json"
    args = ["replay", SELECTED, "--to", candidate.url, "-j", str(journal), "--report", str(report_path)]
    proc = subprocess.Popen([sys.executable, "-m", "smg", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(scripted.received()) < 2:  # the candidate holds r02
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    assert "interrupted" in output
    report = json.loads(report_path.read_text())
    assert report["interrupted"] is True
    assert (report["replayed"], report["identical"]) == (1, 1)
    (run,) = [r for r in _replays_of(journal, {ids["r02"]}) if r["ts"] >= _iso_ts(report["started_at"])]
    assert run["completed"] and run["status"] == 499


def _iso_ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() - 0.001


def test_a_query_that_selects_nothing_is_a_usage_error(
    recorded: tuple[Path, dict[str, str]], candidate: Spawned
) -> None:
    journal, _ = recorded
    result = _replay(journal, "okapi", candidate.url)
    assert result.exit_code == 2, result.output
    assert "no request matches" in result.output
    bad = _replay(journal, "status:>>1", candidate.url)
    assert bad.exit_code == 2 and "not a query" in bad.output
    assert Scripted(candidate.url).received() == []


# -- pieces -------------------------------------------------------------------------------


def test_the_selection_is_read_by_arrival_a_page_at_a_time_ties_included(tmp_path: Path) -> None:
    """Pages of two over seven requests, three of which arrived at the same instant (a page
    boundary falls among them, and a page holds nothing but them): each once, oldest first,
    none from `before` on, none of the replays."""
    journal = tmp_path / "smg-journal.db"
    arrivals = {"a": 100.0, "b": 101.0, "c": 102.0, "d": 102.0, "e": 102.0, "f": 103.0, "g": 104.0, "h": 200.0}

    async def write() -> None:
        writer = JournalWriter(journal)
        await writer.start()
        for rid, ts in arrivals.items():
            headers = {"x-smg-replay-of": "a"} if rid == "f" else {}
            await writer.append(
                rid, 1, Received(method="POST", path="/v1/messages", request_id=rid, headers=headers, ts=ts)
            )
            await writer.append(rid, 2, Completed(status=200, duration_ms=1.0))
        await writer.close()

    asyncio.run(write())
    with JournalReader(journal) as reader:
        assert reader.get_request("f")["replay_of"] == "a"  # type: ignore[index]
        got = [r["id"] for r in select(reader, selection(""), before=150.0, page=2)]
        assert got == ["a", "b", "c", "d", "e", "g"]
        assert [r["id"] for r in select(reader, selection("", include_replays=True), before=150.0, page=1)] == [
            "a",
            "b",
            "c",
            "d",
            "e",
            "f",
            "g",
        ]


@pytest.mark.parametrize(
    ("differences", "kinds"),
    [
        ([Difference("content[0].text", "a", "b")], {"text"}),
        ([Difference("content[1].thinking", "a", "b")], {"text"}),
        ([Difference("content.kinds", ["text"], ["text", "tool_use"])], {"tool_calls"}),
        ([Difference("content.kinds", ["thinking", "text"], ["text"])], {"text"}),
        ([Difference("content[1].input", {}, {"a": 1}), Difference("content[1].name", "a", "b")], {"tool_calls"}),
        ([Difference("stop_reason", "end_turn", "tool_use")], {"stop_reason"}),
        ([Difference("stop_sequence", None, "X")], {"stop_reason"}),
        ([Difference("usage.output_tokens", 1, 2)], {"usage"}),
        ([Difference("status", 200, 529), Difference("error.type", None, "overloaded_error")], {"status"}),
        ([Difference("message", ["text"], None)], {"status"}),
        ([Difference("model", "a", "b"), Difference("id", "x", "y")], {"other"}),
    ],
)
def test_difference_kinds(differences: list[Difference], kinds: set[str]) -> None:
    assert difference_kinds(differences) == kinds


def test_quantiles_exact_then_within_half_a_percent() -> None:
    exact = Quantiles(exact_up_to=100)
    for v in range(1, 101):
        exact.add(float(v))
    assert exact.summary() == {"count": 100, "p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    folded = Quantiles(exact_up_to=100)
    for v in range(1, 100_001):
        folded.add(v / 10)
    summary = folded.summary()
    assert summary["count"] == 100_000 and summary["max"] == 10_000.0
    for label, true in (("p50", 5000.0), ("p90", 9000.0), ("p99", 9900.0)):
        assert abs(summary[label] - true) / true <= 0.005, (label, summary[label])
    assert Quantiles().summary() == {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
