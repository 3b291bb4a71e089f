"""A journal command imports what it reads the journal with, not the gateway: no server
framework, no gRPC or ZMQ, no model libraries, none of the server's own packages, no HTTP
client, not even the CLI framework (typer, and the pydantic it brings) unless it must print
help; rich only to print panels and timelines, not for `stats`, `ls` or JSON (each costs
start-up time on every `smg journal …`); a gateway in front of HTTP workers does not import
the engine wing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tools.build_journal import Traffic, build
from tools.spawn import REPO_ROOT, Spawned, spawn_gateway

FORBIDDEN = (
    "sanic", "grpc", "zmq", "transformers", "tokenizers", "torch", "jinja2",
    "smg.server", "smg.backends", "smg.routing", "smg.admission", "smg.pipeline", "smg.protocol.request",
    "httpx", "anthropic",
)  # fmt: skip
TOOLKIT = ("typer", "pydantic")  # typer's import and adapters were most of a journal command's start-up


@pytest.fixture(scope="module")
def small_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("startup") / "journal.db"
    asyncio.run(build(path, Traffic(20)))
    return path


def _imported(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "smg", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    return set(lines)


@pytest.mark.parametrize(
    "command",
    [
        ["journal", "stats"],
        ["journal", "ls", "--limit", "5"],
        ["journal", "export", "", "--as", "jsonl"],
        ["journal", "stats", "--json"],
        ["journal", "stats", "--by", "model", "--every", "1h", "--json"],
        ["journal", "ls", "-n", "3", "--json"],
        ["journal", "show", "req_00000003"],
        ["journal", "thread", "req_00000003"],
        ["journal", "tail", "--max", "1", "--timeout", "0"],
        ["journal", "stats", "--help"],
    ],
)
def test_a_journal_command_imports_nothing_of_the_gateway(small_journal: Path, command: list[str]) -> None:
    helping = "--help" in command
    imported = _imported(*command, *([] if helping else ["--journal", str(small_journal)]))
    assert "journal.reader" in imported  # the measure works (smg.cli.journal imports it)
    plain = not helping and ("--json" in command or command[1] in ("stats", "ls"))  # printed without rich
    forbidden = (*FORBIDDEN, *(() if helping else TOOLKIT), *(("rich",) if plain else ()))
    found = sorted(m for m in imported if any(m == f or m.startswith(f + ".") for f in forbidden))
    assert not found, found


def test_a_relay_gateway_starts_without_the_engine_wing(worker: Spawned, tmp_path: Path) -> None:
    # The suite starts hundreds of gateways in front of HTTP workers: gRPC, ZMQ and the engine
    # pipeline (tool parsers, templates) are for engine workers only.
    gateway = spawn_gateway([worker.url], journal=tmp_path / "j.db", env={"PYTHONPROFILEIMPORTTIME": "1"})
    gateway.stop()
    imported = {line.split("|")[-1].strip() for line in gateway.log().splitlines() if line.startswith("import time:")}
    assert "smg.server.app" in imported  # the measure works
    engine_wing = (
        "grpc", "zmq", "smg.backends.grpc.backend", "smg.backends.grpc.engines", "smg.backends.zmq.client",
        "smg.pipeline.parsers.tools",
    )  # fmt: skip
    found = sorted(m for m in imported if any(m == f or m.startswith(f + ".") for f in engine_wing))
    assert not found, found
