"""A scripted SGLang engine for the admission tests, and helpers to read the journal as a
request goes (its gates' decisions are journaled before the request completes)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from journal.events import Event
from journal.reader import JournalNotFound, JournalReader
from tests.grpc.conftest import MODEL, QWEN3, target_of
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine

__all__ = ["MODEL", "QWEN3", "events_until", "new_id"]


def new_id() -> str:
    return "adm-" + uuid.uuid4().hex[:12]


def events_until(journal: Path, request_id: str, kind: str, timeout: float = 10.0) -> list[Event]:
    """The request's journaled events once one of `kind` is committed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with JournalReader(journal) as reader:
                events = [e for _, e in reader.events(request_id)]
        except (JournalNotFound, KeyError, LookupError):
            events = []
        if any(e.kind == kind for e in events):
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"no {kind} event for {request_id}: {[e.kind for e in events]}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def adm_engine() -> Iterator[Spawned]:
    proc = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", MODEL])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def engine_control(adm_engine: Spawned) -> Iterator[EngineControl]:
    ctl = EngineControl(target_of(adm_engine.url))
    ctl.reset()
    try:
        yield ctl
    finally:
        ctl.reset()
        ctl.close()
