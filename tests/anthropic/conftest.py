"""Gateways in front of a scripted Anthropic API upstream (the suite's scripted worker), as
real processes on loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tools.spawn import Spawned, free_port, spawn_gateway


@pytest.fixture(scope="session")
def anthropic_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("anthropic") / "journal.db"


@pytest.fixture(scope="session")
def anthropic_gateway(worker: Spawned, anthropic_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway([worker.url], journal=anthropic_journal, extra=["--backend", "anthropic"])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def api(anthropic_gateway: Spawned) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=anthropic_gateway.url, timeout=30.0) as http:
        yield http


@pytest.fixture(scope="module")
def impatient_gateway(worker: Spawned) -> Iterator[Spawned]:
    """Gives the upstream one second."""
    proc = spawn_gateway([worker.url], extra=["--backend", "anthropic", "--request-timeout-secs", "1"])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def unreachable_gateway() -> Iterator[Spawned]:
    """Its only worker URL is a port nothing listens on."""
    proc = spawn_gateway([f"http://127.0.0.1:{free_port()}"], extra=["--backend", "anthropic"])
    try:
        yield proc
    finally:
        proc.stop()
