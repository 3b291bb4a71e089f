"""Offline replay over a journal written by real traffic: today's pipeline recomputes the
recorded blocks byte for byte, and a changed parser or tokenizer is caught by `--check`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from journal.events import Event
from journal.reader import JournalReader
from journal.writer import JournalWriter
from replay.offline import NotReplayable, TokenizerUnavailable, check, load_tokenizer, recompute, recorded_blocks
from smg.cli.main import app
from smg.pipeline.generation import Piece, Text, TextStage, Thinking
from smg.pipeline.parsers.reasoning import make_reasoning_parser
from smg.pipeline.parsers.tools import make_tool_parser
from tests.replay.conftest import LLAMA3, QWEN3, SCENARIOS

runner = CliRunner(env={"COLUMNS": "200"})
GENERATED = [f"{s.name}-{mode}" for s in SCENARIOS for mode in ("plain", "stream")]


def events_of(journal: Path, request_id: str) -> list[Event]:
    with JournalReader(journal) as reader:
        return [e for _, e in reader.events(request_id)]


def dumps(payloads: Sequence[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps(p) for p in payloads]


@pytest.mark.parametrize("name", GENERATED)
def test_recompute_gives_the_recorded_blocks_byte_for_byte(
    name: str, traffic: dict[str, str], replay_journal: Path
) -> None:
    events = events_of(replay_journal, traffic[name])
    recorded = recorded_blocks(events)
    assert recorded[0]["type"] == "message_start" and recorded[-1]["type"] == "message_stop"
    assert dumps(recompute(events)) == dumps(recorded)
    report = check(events)
    assert report.identical and not report.partial, report.differences


def test_the_scenarios_cover_text_stops_tools_and_thinking(traffic: dict[str, str], replay_journal: Path) -> None:
    kinds: dict[str, list[str]] = {}
    stops: dict[str, tuple[str | None, str | None]] = {}
    for name in GENERATED:
        blocks = recorded_blocks(events_of(replay_journal, traffic[name]))
        kinds[name] = [b["content_block"]["type"] for b in blocks if b["type"] == "content_block_start"]
        delta = next(b for b in blocks if b["type"] == "message_delta")["delta"]
        stops[name] = (delta["stop_reason"], delta.get("stop_sequence"))
    for mode in ("plain", "stream"):
        assert kinds[f"tool-{mode}"] == ["text", "tool_use"]
        assert kinds[f"thinking-{mode}"] == ["thinking", "text"]
        assert kinds[f"thinking-tool-{mode}"] == ["thinking", "tool_use"]
        assert stops[f"stop-token-{mode}"] == ("stop_sequence", " three")
        assert stops[f"stop-text-{mode}"] == ("stop_sequence", "STOP")
        assert stops[f"length-{mode}"] == ("max_tokens", None)
        assert stops[f"tool-{mode}"] == ("tool_use", None)


def test_max_tokens_zero_recomputes_to_the_empty_message(traffic: dict[str, str], replay_journal: Path) -> None:
    events = events_of(replay_journal, traffic["zero"])
    assert dumps(recompute(events)) == dumps(recorded_blocks(events))
    assert recorded_blocks(events)[1]["delta"]["stop_reason"] == "max_tokens"


def test_requests_without_a_generation_are_refused_clearly(traffic: dict[str, str], replay_journal: Path) -> None:
    with pytest.raises(NotReplayable, match="count_tokens"):
        recompute(events_of(replay_journal, traffic["count"]))
    with pytest.raises(NotReplayable, match="refused before routing"):
        recompute(events_of(replay_journal, traffic["rejected"]))


def test_a_recorded_relative_tokenizer_path_that_is_not_here_says_so(
    traffic: dict[str, str], replay_journal: Path
) -> None:
    events = events_of(replay_journal, traffic["text-plain"])
    rendered = next(e for e in events if e.kind == "rendered")
    assert rendered.tokenizer == str(QWEN3)  # type: ignore[attr-defined]
    rendered.tokenizer = "not/here/qwen3"  # type: ignore[attr-defined]
    with pytest.raises(TokenizerUnavailable, match="--tokenizer"):
        recompute(events)
    assert dumps(recompute(events, load_tokenizer(QWEN3))) == dumps(recorded_blocks(events))


# -- the CLI -----------------------------------------------------------------------------


def test_cli_offline_one_request(traffic: dict[str, str], replay_journal: Path) -> None:
    result = runner.invoke(app, ["replay", traffic["tool-stream"], "--offline", "--journal", str(replay_journal)])
    assert result.exit_code == 0, result.output
    assert "identical" in result.output and "byte for byte" in result.output
    refused = runner.invoke(app, ["replay", traffic["count"], "--offline", "--journal", str(replay_journal)])
    assert refused.exit_code == 2 and "count_tokens" in refused.output


def test_cli_check_over_all_traffic_passes(traffic: dict[str, str], replay_journal: Path) -> None:
    result = runner.invoke(app, ["replay", "--offline", "--check", "--journal", str(replay_journal)])
    assert result.exit_code == 0, result.output
    assert " 0 different" in result.output and "DIFF" not in result.output
    passed = {line.split()[1] for line in result.output.splitlines() if line.startswith("ok ")}
    assert {traffic[name] for name in [*GENERATED, "zero"]} <= passed


class Shouting:
    """A reasoning parser whose thinking output changed: what a parser regression looks like."""

    def __init__(self, inner: TextStage) -> None:
        self.inner = inner

    def _change(self, pieces: list[Piece]) -> list[Piece]:
        return [Thinking(p.text.upper()) if isinstance(p, Thinking) else p for p in pieces]

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        return self._change(self.inner.feed(pieces))

    def flush(self) -> list[Piece]:
        return self._change(self.inner.flush())


def test_cli_check_catches_a_changed_parser(
    traffic: dict[str, str], replay_journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "smg.pipeline.output.make_reasoning_parser", lambda *a, **k: Shouting(make_reasoning_parser(*a, **k))
    )
    result = runner.invoke(app, ["replay", "--offline", "--check", "--journal", str(replay_journal)])
    assert result.exit_code == 1, result.output
    changed = {traffic[f"{s}-{m}"] for s in ("thinking", "thinking-tool") for m in ("plain", "stream")}
    flagged = {line.split()[1].rstrip(":") for line in result.output.splitlines() if line.startswith("DIFF")}
    assert flagged & set(traffic.values()) == changed  # (the journal may hold replays of them too)
    assert "content[0].thinking" in result.output and '"PLAN"' in result.output and '"plan"' in result.output


def test_cli_offline_catches_a_changed_tool_parser(
    traffic: dict[str, str], replay_journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Renaming:
        def __init__(self, inner: TextStage) -> None:
            self.inner = inner

        def _change(self, pieces: list[Piece]) -> list[Piece]:
            return [Text(p.text.replace("check", "look")) if isinstance(p, Text) else p for p in pieces]

        def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
            return self._change(self.inner.feed(pieces))

        def flush(self) -> list[Piece]:
            return self._change(self.inner.flush())

    monkeypatch.setattr("smg.pipeline.output.make_tool_parser", lambda *a, **k: Renaming(make_tool_parser(*a, **k)))
    result = runner.invoke(app, ["replay", traffic["tool-plain"], "--offline", "--journal", str(replay_journal)])
    assert result.exit_code == 1, result.output
    assert "content[0].text" in result.output and "Let me look." in result.output


def test_cli_check_with_another_tokenizer_reports_differences(traffic: dict[str, str], replay_journal: Path) -> None:
    result = runner.invoke(
        app, ["replay", "--offline", "--check", "--journal", str(replay_journal), "--tokenizer", str(LLAMA3)]
    )
    assert result.exit_code == 1, result.output
    assert "DIFF" in result.output and "different" in result.output


def test_cli_usage_errors_exit_2(traffic: dict[str, str], replay_journal: Path) -> None:
    journal = ["--journal", str(replay_journal)]
    for args in (
        ["replay", traffic["text-plain"], *journal],  # neither --to nor --offline
        ["replay", traffic["text-plain"], "--offline", "--to", "http://127.0.0.1:1", *journal],
        ["replay", "--check", "--to", "http://127.0.0.1:1", *journal],
        ["replay", "--offline", *journal],  # no id
        ["replay", "no-such-request", "--offline", *journal],
        ["replay", traffic["text-plain"], "--offline", "--api-key", "k", *journal],
        ["replay", traffic["text-plain"], "--to", "http://127.0.0.1:1", "--header", "no-colon", *journal],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)


def test_recorded_settings_name_the_parsers_that_ran(traffic: dict[str, str], replay_journal: Path) -> None:
    # The recorded settings say how the output was parsed; recompute reads them, not today's detection.
    events = events_of(replay_journal, traffic["thinking-tool-stream"])
    rendered = next(e for e in events if e.kind == "rendered")
    settings = rendered.settings  # type: ignore[attr-defined]
    assert settings["reasoning_parser"] == "qwen3" and settings["tool_parser"] == "qwen"
    assert json.loads(json.dumps(settings)) == settings


def test_cli_check_over_a_query(traffic: dict[str, str], replay_journal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "smg.pipeline.output.make_reasoning_parser", lambda *a, **k: Shouting(make_reasoning_parser(*a, **k))
    )
    journal = ["--journal", str(replay_journal)]
    result = runner.invoke(app, ["replay", "--offline", "id:rp-thinking-plain|rp-tool-plain", "--check", *journal])
    assert result.exit_code == 1, result.output
    assert "checked 2: 1 identical, 1 different" in result.output
    assert re.search(r"ok   msg_\w+ \(rp-tool-plain\)", result.output), result.output
    assert re.search(r"DIFF msg_\w+ \(rp-thinking-plain\)", result.output), result.output
    clean = runner.invoke(app, ["replay", "--offline", "id:rp-tool-* | id:rp-text-*", "--check", *journal])
    assert clean.exit_code == 0 and "checked 4: 4 identical, 0 different" in clean.output, clean.output
    bad = runner.invoke(app, ["replay", "--offline", "colour:blue", "--check", *journal])
    assert bad.exit_code == 2 and "bad query" in bad.output


@pytest.mark.parametrize("mode", ["redacted", "none"])
async def test_a_journal_without_full_bodies_is_refused_clearly(
    mode: str, traffic: dict[str, str], replay_journal: Path, tmp_path: Path
) -> None:
    copy = tmp_path / f"{mode}.db"
    writer = JournalWriter(copy, bodies=mode)
    await writer.start()
    for seq, event in enumerate(events_of(replay_journal, traffic["text-plain"]), 1):
        await writer.append(traffic["text-plain"], seq, event)
    await writer.close()
    events = events_of(copy, traffic["text-plain"])
    with pytest.raises(NotReplayable, match="--journal-bodies"):
        recompute(events)
    for args in (["--offline"], ["--to", "http://127.0.0.1:1"]):
        result = runner.invoke(app, ["replay", traffic["text-plain"], *args, "--journal", str(copy)])
        assert result.exit_code == 2 and "full bodies" in result.output, result.output
