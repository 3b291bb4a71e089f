"""A Redis server that accepts connections and never answers (blackholed): the first command
finds it out after its socket timeout; from then on the link knows it is down, and requests
get the failure mode's answer at once, sending nothing to the server but the link's probes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.admission.conftest import MODEL, QWEN3
from tools.engine_control import EngineControl
from tools.servers.redis import Unanswering
from tools.spawn import Spawned, spawn_gateway

POLICY = "default_policy: {tokens_per_minute: 100000, requests_per_minute: 6000}\n"
BODY = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "Say hello."}]}
HEADERS = {"Authorization": "Bearer key-one"}


@pytest.fixture
def blackholed() -> Iterator[Unanswering]:
    with Unanswering() as server:
        yield server


def gateway(engine: Spawned, redis_url: str, mode: str, tmp_path: Path) -> Spawned:
    limits = tmp_path / "limits.yaml"
    limits.write_text(POLICY)
    return spawn_gateway(
        [engine.url],
        extra=[
            "--model-path", str(QWEN3), "--tenant-api-key", "one:key-one",
            "--tenant-rate-limit-enabled", "--tenant-rate-limit-config", str(limits),
            "--tenant-rate-limit-state", redis_url,
            "--max-concurrent-requests", "4", "--fleet-concurrency", redis_url,
            "--redis-failure-mode", mode,
        ],
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_requests_do_not_wait_for_a_redis_known_to_be_down(
    adm_engine: Spawned, engine_control: EngineControl, blackholed: Unanswering, mode: str, tmp_path: Path
) -> None:
    engine_control.script(default={"text": "ok"})
    served = gateway(adm_engine, blackholed.url, mode, tmp_path)
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            # The first request's first command waits out the socket timeout: Redis is down.
            first = client.post("/v1/messages", json=BODY, headers=HEADERS)
            before = blackholed.accepted
            answers = [client.post("/v1/messages", json=BODY, headers=HEADERS) for _ in range(5)]
        for answer in [first, *answers]:
            if mode == "open":
                assert answer.status_code == 200, answer.text
            else:
                assert answer.status_code == 503, answer.text
                assert answer.headers["x-smg-error-code"] == "shared_state_unavailable"
        # Five requests, each with a slot to take, a budget to reserve and (open) to settle:
        # none of it was sent; only the link's background probe may have connected meanwhile.
        assert blackholed.accepted - before <= 2, blackholed.accepted - before
        assert served.log().count("is unreachable") == 1, served.log()
    finally:
        served.stop()
