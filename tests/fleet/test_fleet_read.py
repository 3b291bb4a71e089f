"""Every read command on the fleet journal in PostgreSQL says what it says on the local file.

Real traffic through two real gateways writing one local journal: one relays to the scripted
HTTP worker (JSON, SSE, a 529 from upstream, a body the gateway rejects, a stream the worker
cuts, a three-turn Claude Code session), one serves the scripted SGLang engine over gRPC
(text, a tool call and thinking, each buffered and streamed, and a count_tokens). The file is
shipped to a real PostgreSQL by the shipper (`journal.pg.shipper`) as replica `replica-a`, and
then every command runs on both (`-j FILE` and `-j postgresql://…`): ls, show, export in every
format, stats with --by/--every/--plot, thread, diff, replay --offline (one and --check) and
replay --to. Outputs must be equal but for the replica: a column of `ls`'s table and a key
of each JSON summary, which the fleet journal fills and a file leaves empty.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from textual.coordinate import Coordinate
from typer.testing import CliRunner, Result

from journal.pg import schema
from journal.pg.read import PostgresReader
from journal.pg.shipper import Shipper
from journal.reader import JournalReader
from replay.inspector import InspectorApp
from smg.cli.main import app
from tests.conftest import MODEL, Scripted, wait_for_events
from tests.replay.conftest import QWEN3, THINKING, WEATHER
from tools.engine_control import EngineControl
from tools.servers.postgres import PostgresServer
from tools.spawn import Spawned, spawn_engine, spawn_gateway

runner = CliRunner(env={"COLUMNS": "250"})
REPLICA = "replica-a"
GRPC_MODEL = "qwen3-fleet"
SESSION = "fleet-session-1"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCENARIOS = {
    "text": ("Hello there, friend. Nice to meet you!", {"max_tokens": 256}),
    "tool": ("Let me check." + CALL, {"max_tokens": 256, "tools": [WEATHER]}),
    "thinking": ("<think>plan first</think>\n\nThe answer.", {"max_tokens": 2048, "thinking": THINKING}),
}
QUERIES = (
    "",
    "has:error",
    "stream:yes",
    "cut:yes",
    "backend:grpc",
    "backend:http status:200",
    "status:5xx | code:overloaded_error",
    "id:f-",
    "id:f-g*",
    "model:QWEN3-*",
    "session:" + SESSION,
    "friend",
    '"nice to meet"',
    "!friend",
    "frie",
    "weather | paris",
    "has:tool_use | has:thinking",
    "dur:>0 in:>=1",
    "!replica:nobody",
)


@dataclass
class Fleet:
    journal: Path
    url: str
    relay: Spawned
    grpc: Spawned
    engine: Spawned
    ids: dict[str, str] = field(default_factory=dict)

    @property
    def stores(self) -> tuple[str, str]:
        return str(self.journal), self.url


def ship_all(path: Path, url: str) -> None:
    """Ship the file as `REPLICA` with the gateway's own shipper, until the fleet journal holds
    every request the file has (all of them completed)."""
    shipper = Shipper(path, url, REPLICA, idle_s=0.02)
    shipper.start()
    try:
        deadline = time.monotonic() + 60
        with JournalReader(path) as local, PostgresReader(url) as fleet:
            while fleet.count("") < local.count(""):
                assert time.monotonic() < deadline, f"not shipped: {shipper.stats}"
                time.sleep(0.05)
    finally:
        shipper.stop()


@pytest.fixture(scope="module")
def fleet(worker: Spawned, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    journal = tmp_path_factory.mktemp("fleet-read") / "smg-journal.db"
    url = postgres.create_database("fleet_read")
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn)
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", GRPC_MODEL])
    relay = grpc = None
    try:
        relay = spawn_gateway([worker.url], journal=journal, extra=["--disable-retries"])
        grpc = spawn_gateway([engine.url], journal=journal, extra=["--model-path", str(QWEN3)])
        out = Fleet(journal, url, relay, grpc, engine)
        scripted = Scripted(worker.url)
        scripted.reset()
        with EngineControl(engine.url) as control:
            control.reset()
            control.script(
                *(
                    {"text": text, "chunk_size": 2, "when_prompt_contains": f"[{name}]", "repeat": True}
                    for name, (text, _) in SCENARIOS.items()
                )
            )

        def post(gateway: Spawned, rid: str, body: dict[str, Any], path: str = "/v1/messages", **headers: str) -> None:
            response = httpx.post(gateway.url + path, json=body, headers={"x-request-id": rid, **headers}, timeout=30)
            assert response.status_code < 600, response.text
            wait_for_events(journal, rid)
            out.ids[rid] = rid

        user = [{"role": "user", "content": "for the fleet journal"}]
        body = {"model": MODEL, "max_tokens": 16, "messages": user}
        post(relay, "f-json", body)
        post(relay, "f-sse", {**body, "stream": True})
        post(relay, "f-bad", {"model": MODEL})
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy, try later"}}
        scripted.script({"status": 529, "json": error})
        post(relay, "f-overloaded", body)
        scripted.script({"stream_echo": True, "drop_after": 2})
        post(relay, "f-cut", {**body, "stream": True})
        history: list[dict[str, Any]] = []
        for n, text in enumerate(("plan the trip", "add a museum", "and a dinner")):
            history.append({"role": "user", "content": text})
            rid = f"f-turn{n}"
            turn = {"model": MODEL, "max_tokens": 16, "messages": list(history)}
            post(relay, rid, turn, **{"x-claude-code-session-id": SESSION})
            history.append({"role": "assistant", "content": [{"type": "text", "text": f"reply {n}"}]})
        for name, (_, request) in SCENARIOS.items():
            for stream in (False, True):
                grpc_body = {
                    "model": GRPC_MODEL,
                    "temperature": 0,
                    **request,
                    "messages": [{"role": "user", "content": f"[{name}] please answer"}],
                    "stream": stream,
                }
                post(grpc, f"f-g-{name}-{'stream' if stream else 'plain'}", grpc_body)
        post(grpc, "f-g-count", {"model": GRPC_MODEL, "messages": user}, path="/v1/messages/count_tokens")
        ship_all(journal, url)
        yield out
    finally:
        for proc in (grpc, relay, engine):
            if proc is not None:
                proc.stop()


def run(*args: str) -> Result:
    return runner.invoke(app, list(args))


_LOCATION = "<journal>"


def both(fleet: Fleet, *args: str) -> tuple[Result, Result]:
    """The command on the file and on the fleet journal (`-j` last)."""
    local = run(*args, "-j", str(fleet.journal))
    remote = run(*args, "-j", fleet.url)
    return local, remote


def _text(fleet: Fleet, output: str) -> str:
    shown = re.sub(r":[^:@/]+@", ":***@", fleet.url)
    return output.replace(str(fleet.journal), _LOCATION).replace(shown, _LOCATION).replace(fleet.url, _LOCATION)


def without_replica_column(text: str) -> str:
    """A table's lines without its `replica` column (the one whose header says so): a rich
    table's, or the plain columns of `ls`."""
    lines = text.splitlines()
    header = next((line for line in lines if re.search(r"┃ replica +┃", line)), None)
    if header is None:
        plain = next((i for i, line in enumerate(lines) if re.search(r"  replica  ", line)), None)
        if plain is None:
            return "\n".join(line.rstrip() for line in lines)
        column = re.search(r"  replica +", lines[plain])
        assert column is not None
        start, end = column.start() + 2, column.end()
        kept = [line[:start] + line[end:] if i >= plain else line for i, line in enumerate(lines)]
        return "\n".join(line.rstrip() for line in kept)
    start = header.index("┃ replica") + 1
    end = header.index("┃", start) + 1
    out = []
    for line in lines:
        if len(line) >= end and line[:1] in "┏┃┡│└":
            line = line[:start] + line[end:]
        out.append(line.rstrip())
    return "\n".join(out)


def _lines(text: str) -> list[str]:
    """Lines as compared: without the padding a panel adds up to its right edge."""
    return [re.sub(r" +│$", " │", line.rstrip()) for line in text.splitlines()]


def same_text(fleet: Fleet, *args: str) -> str:
    local, remote = both(fleet, *args)
    assert local.exit_code == remote.exit_code, (args, local.output, remote.output)
    mine, theirs = _text(fleet, local.stdout), _text(fleet, remote.stdout)
    theirs = theirs.replace(f"  replica {REPLICA}", "")  # `show`'s header names the replica
    assert _lines(mine) == _lines(without_replica_column(theirs)), args
    assert _text(fleet, local.stderr) == _text(fleet, remote.stderr), args
    return theirs


def _strip(value: Any, seen: list[Any]) -> Any:
    """`value` without the `replica` keys of summary rows (collected into `seen`)."""
    if isinstance(value, dict):
        if "replica" in value and "id" in value and "ts" in value:
            seen.append(value["replica"])
            value = {k: v for k, v in value.items() if k != "replica"}
        return {k: _strip(v, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, seen) for v in value]
    return value


def same_json(fleet: Fleet, *args: str, lines: bool = False) -> Any:
    local, remote = both(fleet, *args)
    assert local.exit_code == remote.exit_code == 0, (args, local.output, remote.output)

    def parse(text: str) -> Any:
        text = _text(fleet, text)
        return [json.loads(line) for line in text.splitlines() if line] if lines else json.loads(text)

    mine, theirs = [], []
    left, right = _strip(parse(local.stdout), mine), _strip(parse(remote.stdout), theirs)
    assert left == right, args
    assert set(mine) <= {None} and set(theirs) <= {REPLICA}, (mine, theirs)
    assert len(mine) == len(theirs)
    return right


# -- the fleet journal holds the file's requests ------------------------------------------


def test_every_request_of_the_file_is_in_the_fleet_journal_marked_with_its_replica(fleet: Fleet) -> None:
    rows = json.loads(run("journal", "ls", "-j", fleet.url, "--json", "--limit", "1000").stdout)
    local = json.loads(run("journal", "ls", "-j", str(fleet.journal), "--json", "--limit", "1000").stdout)
    assert {r["id"] for r in rows} == {r["id"] for r in local} and len(rows) == len(local) == len(fleet.ids) == 15
    assert {r["replica"] for r in rows} == {REPLICA} and {r["replica"] for r in local} == {None}
    by_id = {r["client_id"]: r for r in rows}
    assert by_id["f-cut"]["cut_mid_stream"] and by_id["f-overloaded"]["status"] == 529
    assert by_id["f-bad"]["status"] == 400 and by_id["f-g-tool-stream"]["has_tool_use"]
    assert by_id["f-g-thinking-plain"]["has_thinking"] and by_id["f-g-count"]["path"].endswith("count_tokens")
    table = run("journal", "ls", "-j", fleet.url, "--limit", "1000").stdout
    assert re.search(r"  replica  ", table) and table.count(REPLICA) == len(rows)


# -- ls ------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", QUERIES)
def test_ls_is_the_same_on_both_stores(fleet: Fleet, query: str) -> None:
    rows = same_json(fleet, "journal", "ls", *([query] if query else []), "--json", "--limit", "1000")
    same_text(fleet, "journal", "ls", *([query] if query else []), "--limit", "1000")
    if query in ("", "!replica:nobody"):
        assert len(rows) == 15


def test_replica_selects_a_replica_in_the_fleet_journal_and_nothing_in_a_file(fleet: Fleet) -> None:
    def ids(query: str, journal: str) -> list[str]:
        result = run("journal", "ls", query, "-j", journal, "--json", "--limit", "1000")
        assert result.exit_code == 0, result.output
        return [row["id"] for row in json.loads(result.stdout)]

    everything = ids("", str(fleet.journal))
    assert ids(f"replica:{REPLICA}", fleet.url) == ids("replica:replica-*", fleet.url) == everything
    assert ids("replica:REPLICA-*", fleet.url) == everything  # a pattern ignores case, as every string field's
    assert ids("replica:other", fleet.url) == ids(f"!replica:{REPLICA}", fleet.url) == []
    assert ids(f"replica:{REPLICA}", str(fleet.journal)) == []
    assert ids(f"!replica:{REPLICA}", str(fleet.journal)) == everything
    assert ids(f"replica:{REPLICA} backend:grpc", fleet.url) == ids("backend:grpc", str(fleet.journal))


def test_ls_sorts_pages_and_refuses_alike(fleet: Fleet) -> None:
    for extra in (
        ("--sort", "status", "--asc"),
        ("--sort", "duration_ms"),
        ("--sort", "model", "--asc", "--limit", "4", "--offset", "3"),
        ("--sort", "error_code"),
        ("--limit", "5", "--offset", "5", "--asc"),
    ):
        same_json(fleet, "journal", "ls", "--json", *extra)
        same_text(fleet, "journal", "ls", *extra)
    for bad in (("model:", "--json"), ("foo:bar",), ("--sort", "nope")):
        local, remote = both(fleet, "journal", "ls", *bad)
        assert local.exit_code == remote.exit_code == 2
        assert _text(fleet, local.output) == _text(fleet, remote.output)


# -- show, export, thread, diff -------------------------------------------------------------


def test_show_and_every_single_request_export_are_the_same(fleet: Fleet) -> None:
    for rid in fleet.ids:
        same_text(fleet, "journal", "show", rid)
        same_json(fleet, "journal", "show", rid, "--json")
        same_json(fleet, "journal", "export", rid, "--as", "json")
        same_json(fleet, "journal", "export", rid, "--as", "jsonl", lines=True)
        same_json(fleet, "journal", "export", rid, "--as", "otlp", lines=True)
        same_json(fleet, "journal", "export", rid, "--as", "har")
        same_text(fleet, "journal", "export", rid, "--as", "curl")
    # A unique prefix of the gateway's id, and an unknown id, alike.
    row = json.loads(run("journal", "show", "f-json", "-j", fleet.url, "--json").stdout)["request"]
    same_text(fleet, "journal", "show", row["id"][:-3])
    same_text(fleet, "journal", "show", "nope-no-such-request")


@pytest.mark.parametrize("query", ["", "backend:grpc", "has:error", "friend"])
def test_exports_of_many_are_the_same(fleet: Fleet, query: str) -> None:
    target = [query] if query else []
    same_json(fleet, "journal", "export", *target, "--as", "har")
    same_json(fleet, "journal", "export", *target, "--as", "jsonl", lines=True)
    same_json(fleet, "journal", "export", *target, "--as", "otlp", lines=True)


def test_thread_and_diff_are_the_same(fleet: Fleet) -> None:
    turns = same_json(fleet, "journal", "thread", "f-turn1", "--json")
    assert [t["request"]["client_id"] for t in turns] == ["f-turn0", "f-turn1", "f-turn2"]
    same_text(fleet, "journal", "thread", "f-turn2")
    same_text(fleet, "journal", "thread", "f-bad")
    same_json(fleet, "journal", "diff", "f-turn0", "f-turn2", "--json")
    same_text(fleet, "journal", "diff", "f-turn0", "f-turn2")
    same_text(fleet, "journal", "diff", "f-g-text-plain", "f-g-tool-stream")


# -- stats ----------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "has:error", "backend:http", "stream:yes", "friend"])
def test_stats_are_the_same(fleet: Fleet, query: str) -> None:
    target = [query] if query else []
    numbers = same_json(fleet, "journal", "stats", *target, "--json")
    same_text(fleet, "journal", "stats", *target)
    if not query:
        assert numbers["requests"] == 15 and numbers["errors"] >= 3


@pytest.mark.parametrize(
    "extra",
    [
        ("--by", "model"),
        ("--by", "backend"),
        ("--by", "status"),
        ("--by", "session"),
        ("--every", "1m"),
        ("--by", "worker", "--every", "1h"),
        ("--plot", "requests"),
        ("--plot", "latency_p99", "--every", "10s"),
        ("--by", "model", "--plot", "errors"),
    ],
)
def test_stats_by_group_and_bucket_are_the_same(fleet: Fleet, extra: tuple[str, ...]) -> None:
    same_json(fleet, "journal", "stats", *extra, "--json")
    same_text(fleet, "journal", "stats", *extra)


# -- replay ---------------------------------------------------------------------------------


def test_offline_replay_is_the_same(fleet: Fleet) -> None:
    local, remote = both(fleet, "replay", "--offline", "--check")
    assert local.exit_code == remote.exit_code == 0, remote.output
    assert _text(fleet, local.output) == _text(fleet, remote.output)
    assert "checked 6: 6 identical, 0 different" in remote.output
    for rid in ("f-g-tool-stream", "f-g-thinking-plain"):
        local, remote = both(fleet, "replay", rid, "--offline")
        assert local.exit_code == remote.exit_code == 0 and "identical" in remote.output
        assert _text(fleet, local.output) == _text(fleet, remote.output)
    local, remote = both(fleet, "replay", "f-json", "--offline")  # a relay: nothing to recompute
    assert local.exit_code == remote.exit_code == 2
    assert _text(fleet, local.output) == _text(fleet, remote.output)


def test_live_replay_of_a_fleet_request(fleet: Fleet) -> None:
    """Read from PostgreSQL, sent to a live gateway, which journals the run (`replay_of`)."""
    result = run("replay", "f-g-tool-plain", "--to", fleet.grpc.url, "-j", fleet.url)
    assert result.exit_code == 0, result.output
    assert "identical" in result.output and "compared: structure, text" in result.output
    target = re.search(r"the target's id (\w+)", result.output)
    assert target is not None, result.output
    events = wait_for_events(fleet.journal, target.group(1))
    assert events[0].kind == "received"
    with JournalReader(fleet.journal) as reader:
        row = reader.get_request(target.group(1))
    assert row is not None and row["replay_of"] is not None


# -- prune ----------------------------------------------------------------------------------


def test_prune_needs_a_reachable_server(fleet: Fleet) -> None:
    url = re.sub(r":[^:@/]+@", ":wrong-password@", fleet.url)
    result = run("journal", "prune", "--older-than", "1d", "-j", url)
    assert result.exit_code == 1 and "cannot be pruned" in result.output
    assert "wrong-password" not in result.output


# -- the inspector, and following -------------------------------------------------------------


def _ids_in(app: InspectorApp) -> list[str]:
    table = app.table
    return [str(table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value) for row in range(table.row_count)]


async def test_the_inspector_lists_the_fleet_journal_with_a_replica_column(fleet: Fleet) -> None:
    local, remote = InspectorApp(fleet.journal, refresh_s=0), InspectorApp(fleet.url, refresh_s=0)
    async with local.run_test(size=(220, 40)):
        columns = [key.value for key in local.table.columns]
        listed = _ids_in(local)
    async with remote.run_test(size=(220, 40)) as pilot:
        assert [key.value for key in remote.table.columns] == [*columns[:2], "replica", *columns[2:]]
        shipped = {r["id"] for r in json.loads(run("journal", "ls", "-j", fleet.url, "--json").stdout)}
        # The file also has what replays here journaled since it shipped.
        assert _ids_in(remote) == [i for i in listed if i in shipped] and len(shipped) == 15
        cells = [str(remote.table.get_cell_at(Coordinate(row, 2))) for row in range(remote.table.row_count)]
        assert set(cells) == {REPLICA}
        await pilot.press("slash")
        await pilot.press(*"replica:nobody", "enter")
        await pilot.pause()
        for _ in range(100):  # the search runs on a thread of its own
            if remote.search is None:
                break
            await asyncio.sleep(0.05)
        assert _ids_in(remote) == []


def test_tail_follows_the_fleet_journal(fleet: Fleet) -> None:
    """`tail` on the fleet journal prints requests as they arrive in PostgreSQL, from any replica."""
    tail = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smg",
            "journal",
            "tail",
            "--json",
            "--max",
            "2",
            "--timeout",
            "60",
            "-j",
            fleet.url,
            "--interval",
            "0.1",
            "backend:http",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tail.stderr is not None and "following" in tail.stderr.readline()
        body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "tail me"}]}
        for rid in ("f-tail-1", "f-tail-2"):
            response = httpx.post(fleet.relay.url + "/v1/messages", json=body, headers={"x-request-id": rid})
            assert response.status_code == 200
            wait_for_events(fleet.journal, rid)
        ship_all(fleet.journal, fleet.url)
        out, _ = tail.communicate(timeout=60)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["client_id"], r["replica"]) for r in rows] == [("f-tail-1", REPLICA), ("f-tail-2", REPLICA)]
    assert tail.returncode == 0
