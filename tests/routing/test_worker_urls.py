"""The worker API as an attack surface, against real gateways on loopback: the gateway refuses
itself as a worker (by address, at start and at run time), a loop it cannot see by address
(through a second gateway) is cut by the hop header at its first return, URLs with parts
their kind does not take are refused before anything is sent to them, a failed probe's
`last_error` says the status and never the answer, and one warning says when the admin
routes are open to the network."""

from __future__ import annotations

import logging
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from smg.cli.launch import warn_if_admin_is_open
from smg.config import GatewayConfig
from smg.protocol.hops import HOP_HEADER, MAX_HOPS
from smg.routing.self_address import ListeningAddress
from tests.conftest import MODEL, Scripted
from tools.spawn import REPO_ROOT, Spawned, free_port, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
FOREIGN = "0123456789abcdef"  # another gateway's id, as it would put it in the chain


def _wait(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _journaled(journal: Path) -> int:
    with sqlite3.connect(journal) as conn:
        return int(conn.execute("SELECT count(*) FROM requests WHERE path LIKE '/v1/messages%'").fetchone()[0])


class _CountingListener:
    """A loopback port that counts the connections made to it (and answers none)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def gateway_a(worker: Spawned, tmp_path: Path) -> Iterator[tuple[Spawned, Path]]:
    journal = tmp_path / "a.db"
    gw = spawn_gateway([worker.url], journal=journal, extra=["--policy", "round_robin", "--disable-retries"])
    try:
        yield gw, journal
    finally:
        gw.stop()


def _own_id(gateway: Spawned, scripted: Scripted) -> str:
    """The gateway's hop id, as a worker sees it."""
    scripted.reset()
    assert httpx.post(gateway.url + "/v1/messages", json=BODY, timeout=10).status_code == 200
    (received,) = scripted.received()
    return str(received["headers"][HOP_HEADER])


def test_the_gateway_refuses_its_own_address_as_a_worker(gateway_a: tuple[Spawned, Path]) -> None:
    gw, _ = gateway_a
    port = gw.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for url in (gw.url, f"http://localhost:{port}", f"http://127.0.0.1:{port}/", f"grpc://127.0.0.1:{port}"):
            refused = client.post("/workers", json={"url": url})
            assert refused.status_code == 400, (url, refused.text)
            assert refused.json()["code"] == "WORKER_IS_GATEWAY", url
        assert client.get("/workers").json()["total"] == 1


def test_the_gateway_refuses_its_own_address_at_start() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--no-journal",
         "--worker-urls", f"http://localhost:{port}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "leads to this gateway itself" in result.stderr


def test_a_wildcard_listener_is_every_local_address_on_its_port() -> None:
    listening = ListeningAddress("0.0.0.0", 30123)
    assert listening.leads_here("http://127.0.0.2:30123")  # all of 127/8 is this host
    assert listening.leads_here("http://localhost:30123")
    assert listening.leads_here("http://0.0.0.0:30123")
    assert not listening.leads_here("http://127.0.0.1:30124")
    assert not listening.leads_here("http://192.0.2.1:30123")  # TEST-NET-1: not this host's
    try:
        own = socket.gethostbyname(socket.gethostname())
    except OSError:
        own = None
    if own is not None:  # the host's own name and interface address (resolved; bind only, nothing sent)
        assert listening.leads_here(f"http://{socket.gethostname()}:30123")
        assert listening.leads_here(f"http://{own}:30123")
    bound = ListeningAddress("127.0.0.1", 30123)
    assert bound.leads_here("http://localhost:30123")
    assert not bound.leads_here("http://127.0.0.2:30123")  # nothing of this gateway listens there


def test_a_request_that_comes_back_is_refused_and_a_chain_of_other_gateways_is_served(
    gateway_a: tuple[Spawned, Path], scripted: Scripted
) -> None:
    gw, journal = gateway_a
    own = _own_id(gw, scripted)
    assert len(own) == 16
    looped = httpx.post(gw.url + "/v1/messages", json=BODY, headers={HOP_HEADER: f"{FOREIGN}, {own}"}, timeout=10)
    assert looped.status_code == 508
    assert looped.headers["x-smg-error-code"] == "loop_detected"
    assert looped.json()["type"] == "error" and looped.json()["error"]["type"] == "api_error"
    assert HOP_HEADER not in looped.headers
    # Probes are refused too (a gateway discovering itself through another name).
    assert httpx.get(gw.url + "/v1/models", headers={HOP_HEADER: own}, timeout=10).status_code == 508
    scripted.reset()
    served = httpx.post(
        gw.url + "/v1/messages", json=BODY, headers={HOP_HEADER: f"{FOREIGN}, not-an-id, {'f' * 40}"}, timeout=10
    )
    assert served.status_code == 200 and HOP_HEADER not in served.headers
    (received,) = scripted.received()
    assert received["headers"][HOP_HEADER] == f"{FOREIGN}, {own}"  # the chain, well-formed ids only, then ours
    too_long = ", ".join(f"{i:016x}" for i in range(MAX_HOPS))
    assert httpx.post(gw.url + "/v1/messages", json=BODY, headers={HOP_HEADER: too_long}, timeout=10).status_code == 508
    _wait(lambda: _journaled(journal) == 4, "the four requests in the journal")


def test_a_loop_through_a_second_gateway_is_cut_at_its_first_return(
    gateway_a: tuple[Spawned, Path], scripted: Scripted, tmp_path: Path
) -> None:
    gw_a, journal_a = gateway_a
    journal_b = tmp_path / "b.db"
    # B relays to A; A then takes B as a worker too: A → B → A is a loop neither sees by address.
    gw_b = spawn_gateway([gw_a.url], journal=journal_b, extra=["--disable-retries"])
    try:
        with httpx.Client(base_url=gw_a.url, timeout=10) as client:
            added = client.post("/workers", json={"url": gw_b.url})
            assert added.status_code == 202, added.text
            worker_id = added.json()["worker_id"]
            _wait(lambda: client.get(f"/workers/{worker_id}").json()["status"] == "ready", "B as A's worker")
            statuses = [client.post("/v1/messages", json=BODY).status_code for _ in range(6)]
        # Round robin: half of them went to B, came back to A and were refused there.
        assert statuses.count(200) == 3 and statuses.count(508) == 3, statuses
        # Each looped request is two in A's journal (the client's, its refused return) and one in B's.
        _wait(lambda: _journaled(journal_a) >= 9 and _journaled(journal_b) >= 3, "every request journaled")
        assert (_journaled(journal_a), _journaled(journal_b)) == (9, 3)
    finally:
        gw_b.stop()


def test_urls_with_parts_their_kind_does_not_take_are_refused_before_any_connect(
    gateway_a: tuple[Spawned, Path],
) -> None:
    gw, _ = gateway_a
    listener = _CountingListener()
    base = f"127.0.0.1:{listener.port}"
    try:
        with httpx.Client(base_url=gw.url, timeout=10) as client:
            for url in (
                f"http://{base}/prefix",
                f"http://{base}?q=1",
                f"http://{base}/#frag",
                f"http://user:pw@{base}",
                f"https://{base}/v1",
                f"grpc://{base}/x",
                "http://127.0.0.1:99999",
                f"http://{base}/a b",
            ):
                refused = client.post("/workers", json={"url": url})
                assert refused.status_code == 400, (url, refused.text)
                assert refused.json()["code"] == "INVALID_WORKER_URL", (url, refused.json())
            assert client.get("/workers").json()["total"] == 1
            # An origin of the same listener is taken, and probed: the listener does count.
            assert client.post("/workers", json={"url": f"http://{base}"}).status_code == 202
            _wait(lambda: listener.accepted > 0, "the accepted worker's probe")
    finally:
        listener.close()


def test_a_failed_probe_says_its_status_and_never_the_answer(gateway_a: tuple[Spawned, Path]) -> None:
    gw, _ = gateway_a
    keyed = spawn_gateway([], extra=["--enable-igw", "--api-key", "k"])  # its /v1/models answers 401 and a body
    try:
        with httpx.Client(base_url=gw.url, timeout=10) as client:
            worker_id = client.post("/workers", json={"url": keyed.url}).json()["worker_id"]
            _wait(lambda: "last_error" in client.get(f"/workers/{worker_id}").json(), "a failed discovery")
            error = client.get(f"/workers/{worker_id}").json()["last_error"]
        assert error == "model discovery failed: answered HTTP 401 Unauthorized"
    finally:
        keyed.stop()


def test_one_warning_when_the_admin_routes_are_open_to_the_network(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="smg.launch")
    assert warn_if_admin_is_open(GatewayConfig(host="0.0.0.0"), None)
    assert not warn_if_admin_is_open(GatewayConfig(host="0.0.0.0", api_key="k"), None)
    assert not warn_if_admin_is_open(GatewayConfig(host="127.0.0.1"), None)
    assert not warn_if_admin_is_open(GatewayConfig(host="localhost"), None)
    warnings = [r for r in caplog.records if "admin routes" in r.getMessage()]
    assert len(warnings) == 1 and "--api-key" in warnings[0].getMessage()
