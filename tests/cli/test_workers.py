"""`smg launch --workers N`: N gateway processes on one listening socket and one journal file."""

from __future__ import annotations

from pathlib import Path

import httpx

from journal.reader import JournalReader
from smg.projection import reconstruct
from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hello workers"}]}


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def test_several_processes_serve_and_journal_into_one_file(tmp_path: Path, worker: Spawned, scripted: Scripted) -> None:
    journal = tmp_path / "j.db"
    gateway = spawn_gateway([worker.url], journal=journal, extra=["--workers", "2", "--log-level", "warning"])
    try:
        assert len(_children(gateway.proc.pid)) == 2
        ids = []
        bodies = {}
        for i in range(12):  # a connection each: the kernel hands them to either process
            body = {**BODY, "stream": i % 2 == 0}
            response = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=30.0)
            assert response.status_code == 200, response.text
            ids.append(response.headers["x-request-id"])
            bodies[ids[-1]] = response.content
        for request_id in ids:
            wait_for_events(journal, request_id)
        with JournalReader(journal) as reader:
            assert reader.count("") == 12
            for request_id in ids:  # every process's requests rebuild from the one file
                assert reconstruct(e for _, e in reader.events(request_id)).body == bodies[request_id]
        children = _children(gateway.proc.pid)
    finally:
        gateway.stop()
    assert gateway.proc.returncode is not None
    for child in children:  # stopping the gateway stopped its processes
        assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text().lower()
