"""Budgets charge every request the gateway generates itself, whatever wire its engine speaks:
a ZMQ EngineCore and a gRPC prefill/decode pair, each behind a gateway with tenant budgets and
`/metrics`. The upstream-response counter labels those answers `router_type="grpc"` (the
reference's generating router), a relayed one `http`."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from journal.events import Admission, Settled
from tests.admission.test_budgets import bucket
from tests.conftest import MODEL as RELAY_MODEL
from tests.conftest import wait_for_events
from tests.grpc.conftest import QWEN3
from tests.observability.test_metrics_live import scrape
from tests.zmq.conftest import MODEL as ZMQ_MODEL
from tests.zmq.conftest import socket_dir, wait_ready
from tools.spawn import Spawned, free_port, spawn_engine, spawn_gateway, spawn_zmq_engine

PD_MODEL = "pd-budgets"
POLICY = "default_policy: {tokens_per_minute: 6000, requests_per_minute: 600}\n"
USER = [{"role": "user", "content": "Say hello."}]
KEY = {"Authorization": "Bearer key-payer"}


@pytest.fixture
def budget_flags(tmp_path: Path) -> tuple[list[str], Path, int]:
    """The gateway's budget and metrics flags, its state file and its metrics port."""
    (tmp_path / "limits.yaml").write_text(POLICY)
    state = tmp_path / "state.db"
    port = free_port()
    flags = [
        "--tenant-api-key",
        "payer:key-payer",
        "--tenant-rate-limit-enabled",
        "--tenant-rate-limit-config",
        str(tmp_path / "limits.yaml"),
        "--tenant-rate-limit-state",
        str(state),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(port),
    ]
    return flags, state, port


def _charged(gateway: Spawned, journal: Path, state: Path, model: str) -> None:
    """One request of tenant `payer` is reserved, settled and drawn from its bucket."""
    with httpx.Client(base_url=gateway.url, timeout=30.0) as http:
        wait_ready(http)
        answer = http.post("/v1/messages", json={"model": model, "max_tokens": 16, "messages": USER}, headers=KEY)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    events = wait_for_events(journal, answer.headers["x-request-id"])
    [gate] = [e for e in events if isinstance(e, Admission) and e.gate == "tenant_rate_limit"]
    assert gate.decision == "admitted" and gate.tenant == "auth:payer"
    assert gate.reserved_tokens == usage["input_tokens"] > 0
    [settled] = [e for e in events if isinstance(e, Settled)]
    assert settled.input_tokens + settled.output_tokens == usage["input_tokens"] + usage["output_tokens"]
    bucket(state, "payer")  # the tenant's bucket exists in the state file: it was drawn from


def test_a_zmq_request_is_charged_and_labelled_as_generated(budget_flags: tuple[list[str], Path, int]) -> None:
    flags, state, port = budget_flags
    sockets = socket_dir()
    journal = state.parent / "journal.db"
    engine: Spawned | None = None
    gateway = spawn_gateway(
        [f"ipc://{sockets / 'w0'}"], journal=journal, extra=["--backend", "vllm", "--model-path", ZMQ_MODEL, *flags]
    )
    try:
        engine = spawn_zmq_engine(sockets / "w0", QWEN3, ["--max-model-len", "256"])
        _charged(gateway, journal, state, ZMQ_MODEL)
        metrics = scrape(port)
        assert (
            metrics.value("smg_router_upstream_responses_total", router_type="grpc", status_code="200", error_code="")
            == 1
        )
        assert metrics.total("smg_router_upstream_responses_total", router_type="http") == 0
        assert metrics.total("smg_router_requests_total", router_type="grpc", backend_type="regular") == 1
    finally:
        gateway.stop()
        if engine is not None:
            engine.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def test_a_grpc_pd_request_is_charged_and_labelled_as_generated(budget_flags: tuple[list[str], Path, int]) -> None:
    flags, state, port = budget_flags
    journal = state.parent / "journal.db"
    legs: list[Spawned] = []
    gateway: Spawned | None = None
    try:
        for role in ("prefill", "decode"):
            legs.append(
                spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", PD_MODEL, "--role", role])
            )
        gateway = spawn_gateway(
            [],
            journal=journal,
            extra=["--pd-disaggregation", "--prefill", legs[0].url, "9123", "--decode", legs[1].url,
                   "--model-path", str(QWEN3), "--disable-retries", *flags],
        )  # fmt: skip
        _charged(gateway, journal, state, PD_MODEL)
        metrics = scrape(port)
        # Each leg's answer is an upstream response of the generating router.
        assert metrics.total("smg_router_upstream_responses_total", router_type="grpc") >= 1
        assert metrics.total("smg_router_upstream_responses_total", router_type="http") == 0
        assert metrics.total("smg_router_requests_total", router_type="grpc", backend_type="pd") == 1
    finally:
        if gateway is not None:
            gateway.stop()
        for leg in legs:
            leg.stop()


def test_a_relayed_answer_is_labelled_http(worker: Spawned, budget_flags: tuple[list[str], Path, int]) -> None:
    flags, _, port = budget_flags
    gateway = spawn_gateway([worker.url], extra=flags)
    try:
        answer = httpx.post(
            f"{gateway.url}/v1/messages",
            json={"model": RELAY_MODEL, "max_tokens": 8, "messages": USER},
            headers=KEY,
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        metrics = scrape(port)
        assert (
            metrics.value("smg_router_upstream_responses_total", router_type="http", status_code="200", error_code="")
            == 1
        )
        assert metrics.total("smg_router_upstream_responses_total", router_type="grpc") == 0
    finally:
        gateway.stop()
