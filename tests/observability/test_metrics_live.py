"""`/metrics` over loopback: a gateway with `--prometheus-port` in front of real workers, its
exposition parsed with the Prometheus client's own parser and compared with the traffic sent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from journal.reader import JournalReader
from smg.observability.config import DEFAULT_DURATION_BUCKETS
from tests.conftest import Scripted
from tests.grpc.conftest import QWEN3
from tools.spawn import Spawned, free_port, spawn_engine, spawn_gateway, spawn_worker

MODEL = "metrics-model"
BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "count me"}]}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Scrape:
    """One parsed exposition: every sample by name and labels, and each family's type."""

    def __init__(self, text: str) -> None:
        self.samples: Samples = {}
        self.types: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels (0 when absent, as Prometheus reads a missing series)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of `name` whose labels include these."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def labels(self, name: str) -> list[dict[str, str]]:
        return [dict(ls) for (n, ls) in self.samples if n == name]


def scrape(port: int) -> Scrape:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10.0)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Spawned]]:
    # One pair for the module: each test resets the workers it uses (scripts, records, held
    # streams) and starts its own gateway, and none ends a worker.
    spawned = [spawn_worker(models=[MODEL]) for _ in range(2)]
    try:
        yield spawned
    finally:
        for proc in spawned:
            proc.stop()


def _gateway(urls: list[str], port: int, *extra: str, journal: Path | None = None) -> Spawned:
    return spawn_gateway(
        urls,
        journal=journal,
        extra=["--prometheus-host", "127.0.0.1", "--prometheus-port", str(port), *extra],
    )


def test_http_and_router_counters_match_the_traffic_sent(workers: list[Spawned]) -> None:
    worker = workers[0]
    handle = Scripted(worker.url)
    handle.reset()
    port = free_port()
    gw = _gateway([worker.url], port, "--disable-retries")
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            for _ in range(3):
                assert client.post("/v1/messages", json=BODY).status_code == 200
            for _ in range(2):
                with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as streamed:
                    assert streamed.status_code == 200
                    streamed.read()
            assert client.post("/v1/messages", json={**BODY, "model": "no-such-model"}).status_code == 404
            assert client.post("/v1/messages", json={"model": MODEL, "messages": []}).status_code == 400
            assert client.post(
                "/v1/messages/count_tokens", json={"model": MODEL, "messages": BODY["messages"]}
            ).is_success
            handle.script({"status": 500, "json": {"type": "error", "error": {"type": "api_error", "message": "x"}}})
            assert client.post("/v1/messages", json=BODY).status_code == 500
            assert client.get("/workers").status_code == 200
            assert client.get(f"/workers/{'0' * 8}").status_code == 400  # not a UUID
        m = scrape(port)
    finally:
        gw.stop()

    assert m.value("smg_http_requests_total", method="POST", path="/v1/messages") == 3 + 2 + 1 + 1 + 1
    assert m.value("smg_http_requests_total", method="POST", path="/v1/messages/count_tokens") == 1
    assert m.value("smg_http_requests_total", method="GET", path="/workers") == 1
    # A route with a parameter is counted under its pattern: clients do not mint label values.
    assert m.value("smg_http_requests_total", method="GET", path="/workers/{worker_id}") == 1

    assert m.value("smg_http_responses_total", path="/v1/messages", status_code="200", error_code="") == 5
    assert (
        m.value("smg_http_responses_total", path="/v1/messages", status_code="404", error_code="model_not_found") == 1
    )
    assert m.total("smg_http_responses_total", path="/v1/messages", status_code="400") == 1
    assert m.total("smg_http_responses_total", path="/v1/messages", status_code="500") == 1
    assert m.value("smg_http_responses_total", path="/v1/messages/count_tokens", status_code="200", error_code="") == 1
    assert m.value("smg_http_responses_total", path="/workers", status_code="200", error_code="") == 1
    assert m.value("smg_http_request_duration_seconds_count", method="POST", path="/v1/messages") == 8
    assert m.types["smg_http_request_duration_seconds"] == "histogram"
    assert m.value("smg_http_connections_active") >= 0

    route = {"router_type": "http", "backend_type": "regular", "connection_mode": "http", "endpoint": "messages"}
    assert m.value("smg_router_requests_total", **route, model=MODEL, streaming="false") == 4
    assert m.value("smg_router_requests_total", **route, model=MODEL, streaming="true") == 2
    # An unknown model is `other`, and its error is `no_workers`, as the reference labels them.
    assert m.value("smg_router_requests_total", **route, model="other", streaming="false") == 1
    assert m.value("smg_router_request_errors_total", **route, model="other", error_type="no_workers") == 1
    assert m.value("smg_router_request_errors_total", **route, model=MODEL, error_type="backend_error") == 1
    assert m.value("smg_router_requests_total", **{**route, "endpoint": "other"}, model=MODEL, streaming="false") == 1
    assert m.value("smg_router_upstream_responses_total", router_type="http", status_code="200", error_code="") == 6
    assert m.value("smg_router_upstream_responses_total", router_type="http", status_code="500", error_code="") == 1
    assert m.value("smg_http_rate_limit_total", result="allowed") == 9

    selection = {"worker_type": "regular", "connection_mode": "http", "model": MODEL}
    assert m.value("smg_worker_selection_total", **selection, policy="cache_aware") == 7
    assert m.value("smg_worker_requests_total", worker=worker.url, model=MODEL) == 7
    assert m.value("smg_worker_pool_size", worker_type="regular", connection_mode="http", model=MODEL) == 1
    assert m.value("smg_worker_health", worker=worker.url) == 1
    assert m.value("smg_worker_cb_state", worker=worker.url) == 0
    assert m.value("smg_worker_requests_active", worker=worker.url) == 0
    # The reference's default buckets, on every duration histogram.
    bounds = sorted(
        float(labels["le"])
        for labels in m.labels("smg_http_request_duration_seconds_bucket")
        if labels["path"] == "/workers"
    )
    assert bounds == [*DEFAULT_DURATION_BUCKETS, float("inf")]


def test_retries_and_an_opening_breaker_are_counted(workers: list[Spawned]) -> None:
    first, second = workers
    failing, healthy = Scripted(first.url), Scripted(second.url)
    failing.reset()
    healthy.reset()
    port = free_port()
    gw = _gateway(
        [first.url, second.url],
        port,
        "--policy",
        "round_robin",
        "--cb-failure-threshold",
        "2",
        "--disable-health-check",
        "--retry-initial-backoff-ms",
        "1",
    )
    try:
        failing.script(*[{"status": 503, "body": "busy"}] * 2)
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            sent = 0
            # Round robin sends every other request to `first`; its two 503s are retried on `second`.
            while len(failing.received()) < 2:
                assert client.post("/v1/messages", json=BODY).status_code == 200
                sent += 1
                assert sent < 10
        m = scrape(port)
    finally:
        gw.stop()

    assert m.value("smg_worker_retries_total", worker_type="regular", endpoint="messages") == 2
    assert m.value("smg_router_upstream_responses_total", router_type="http", status_code="503", error_code="") == 2
    assert m.value("smg_worker_cb_outcomes_total", worker=first.url, outcome="failure") == 2
    assert m.value("smg_worker_cb_transitions_total", worker=first.url, **{"from": "closed", "to": "open"}) == 1
    assert m.value("smg_worker_cb_state", worker=first.url) == 1
    assert m.value("smg_worker_cb_state", worker=second.url) == 0
    assert (
        m.value(
            "smg_worker_selection_total",
            worker_type="regular",
            connection_mode="http",
            model=MODEL,
            policy="round_robin",
        )
        == sent + 2
    )
    assert (
        m.value(
            "smg_router_requests_total",
            router_type="http",
            backend_type="regular",
            connection_mode="http",
            model=MODEL,
            endpoint="messages",
            streaming="false",
        )
        == sent
    )


def test_exhausted_retries_are_counted(workers: list[Spawned]) -> None:
    worker = workers[0]
    handle = Scripted(worker.url)
    handle.reset()
    handle.script(*[{"status": 503, "body": "busy"}] * 2)
    port = free_port()
    gw = _gateway(
        [worker.url],
        port,
        "--retry-max-retries",
        "2",
        "--retry-initial-backoff-ms",
        "1",
        "--cb-failure-threshold",
        "10",
    )
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            assert client.post("/v1/messages", json=BODY).status_code == 503
        m = scrape(port)
    finally:
        gw.stop()
    assert m.value("smg_worker_retries_total", worker_type="regular", endpoint="messages") == 1
    assert m.value("smg_worker_retries_exhausted_total", worker_type="regular", endpoint="messages") == 1
    assert m.total("smg_router_request_errors_total", model=MODEL, error_type="backend_error") == 1


def test_grpc_tokens_ttft_and_tpot_follow_the_usage_returned() -> None:
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", "qwen3-metrics"])
    port = free_port()
    try:
        gw = _gateway([engine.url], port, "--model-path", str(QWEN3))
        try:
            body = {"model": "qwen3-metrics", "max_tokens": 6, "messages": [{"role": "user", "content": "hello"}]}
            usage = {"input_tokens": 0, "output_tokens": 0}
            with httpx.Client(base_url=gw.url, timeout=60.0) as client:
                whole = client.post("/v1/messages", json=body)
                assert whole.status_code == 200
                for key in usage:
                    usage[key] += whole.json()["usage"][key]
                with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as streamed:
                    text = streamed.read().decode()
                for line in text.splitlines():
                    if line.startswith("data: ") and '"message_delta"' in line:
                        for key, value in orjson.loads(line[6:])["usage"].items():
                            if key in usage:
                                usage[key] += value
                assert client.post(
                    "/v1/messages/count_tokens", json={"model": "qwen3-metrics", "messages": body["messages"]}
                ).is_success
            m = scrape(port)
        finally:
            gw.stop()
    finally:
        engine.stop()

    inference = {"router_type": "grpc", "backend_type": "regular", "model": "qwen3-metrics", "endpoint": "messages"}
    assert m.value("smg_router_tokens_total", **inference, token_type="output") == usage["output_tokens"]
    assert m.value("smg_router_tokens_total", **inference, token_type="input") == usage["input_tokens"]
    assert m.value("smg_router_ttft_seconds_count", **inference) == 2
    assert m.value("smg_router_tpot_seconds_count", **inference) == 2
    assert m.value("smg_router_generation_duration_seconds_count", **inference) == 2
    assert m.types["smg_router_ttft_seconds"] == "histogram"
    route = {"router_type": "grpc", "backend_type": "regular", "connection_mode": "grpc", "model": "qwen3-metrics"}
    assert m.value("smg_router_requests_total", **route, endpoint="messages", streaming="true") == 1
    assert m.value("smg_router_requests_total", **route, endpoint="other", streaming="false") == 1
    # count_tokens is answered by the gateway: no worker is selected for it.
    assert (
        m.value(
            "smg_worker_selection_total",
            worker_type="regular",
            connection_mode="grpc",
            model="qwen3-metrics",
            policy="cache_aware",
        )
        == 2
    )


def test_journal_counters_match_the_file(workers: list[Spawned], tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    port = free_port()
    gw = _gateway([workers[0].url], port, journal=journal)
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            for _ in range(4):
                assert client.post("/v1/messages", json=BODY).status_code == 200
        deadline = time.monotonic() + 15
        while True:
            m = scrape(port)
            with JournalReader(journal) as reader:  # a packed row holds several events
                stored = sum(len(reader.raw_events(row["id"])) for row in reader.list_requests(limit=100))
            if m.value("smg_journal_queue_depth") == 0 and m.value("smg_journal_events_written_total") == stored:
                break
            assert time.monotonic() < deadline, "the journal's counters never matched its file"
            time.sleep(0.1)
    finally:
        gw.stop()
    assert stored >= 4 * 4  # received, validated, routed, …, completed per request
    assert m.value("smg_journal_events_dropped_total") == 0
    assert m.value("smg_journal_batches_total") >= 1
    assert m.value("smg_journal_batch_size_max") >= 1
    assert m.value("smg_journal_commit_seconds_total") > 0
    assert m.value("smg_journal_failing") == 0


def test_duration_buckets_flag_and_other_paths_of_the_listener(workers: list[Spawned]) -> None:
    port = free_port()
    gw = _gateway([workers[0].url], port, "--prometheus-duration-buckets", "0.5", "2", "30")
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            assert client.post("/v1/messages", json=BODY).status_code == 200
        m = scrape(port)
        assert httpx.get(f"http://127.0.0.1:{port}/other").status_code == 404
        assert httpx.post(f"http://127.0.0.1:{port}/metrics").status_code == 405
        # The gateway's own port does not serve metrics.
        assert httpx.get(f"{gw.url}/metrics").status_code == 404
    finally:
        gw.stop()
    bounds = sorted(float(labels["le"]) for labels in m.labels("smg_router_request_duration_seconds_bucket"))
    assert sorted(set(bounds)) == [0.5, 2.0, 30.0, float("inf")]


def test_gauges_follow_a_stream_held_open(workers: list[Spawned]) -> None:
    worker = workers[0]
    handle = Scripted(worker.url)
    handle.reset()
    handle.script({"stream_echo": True, "hold_after": 2})
    port = free_port()
    gw = _gateway([worker.url], port)
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as held:
                assert held.status_code == 200
                frames = held.iter_bytes()
                next(frames)  # the stream is under way, its worker holds the rest
                during = scrape(port)
                handle.release()
                for _ in frames:
                    pass
        deadline = time.monotonic() + 10
        while (after := scrape(port)).value("smg_http_connections_active") != 0:
            assert time.monotonic() < deadline, "the closed connection is still counted"
            time.sleep(0.05)
    finally:
        gw.stop()
    assert during.value("smg_worker_requests_active", worker=worker.url) == 1
    assert during.value("smg_http_connections_active") == 1
    # The stream's response is counted once it has ended, not when its head went out.
    assert during.total("smg_http_responses_total", path="/v1/messages") == 0
    assert after.value("smg_worker_requests_active", worker=worker.url) == 0
    assert after.value("smg_http_responses_total", path="/v1/messages", status_code="200", error_code="") == 1


def test_a_client_gone_mid_stream_is_a_499(workers: list[Spawned]) -> None:
    worker = workers[0]
    handle = Scripted(worker.url)
    handle.reset()
    handle.script({"stream_echo": True, "hold_after": 2})
    port = free_port()
    gw = _gateway([worker.url], port)
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as held:
                next(held.iter_bytes())
        # The client has closed its connection while the worker still holds the stream.
        gone = {"path": "/v1/messages", "status_code": "499", "error_code": "client_closed_request"}
        deadline = time.monotonic() + 10
        while (m := scrape(port)).value("smg_http_responses_total", **gone) != 1:
            assert time.monotonic() < deadline, "the request cut off was never counted"
            time.sleep(0.05)
        handle.release()
    finally:
        gw.stop()
    assert m.total("smg_http_responses_total", path="/v1/messages") == 1
    assert m.value("smg_worker_requests_active", worker=worker.url) == 0
