"""`--dp-aware` over gRPC, over loopback: scripted engines with several data-parallel ranks, a real
gateway serving each rank as a worker (`url@rank`), every `Generate` the engines got read back
for its `data_parallel_rank` — alone, as both legs of a prefill/decode pair, and with the rank
policy (`--dp-minimum-tokens-scheduler`) choosing the rank."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from journal.events import Routed
from tests.conftest import wait_for_events
from tests.grpc.conftest import QWEN3, target_of
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway

MODEL = "dp-fixture"
BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]}
ROUND_ROBIN = ["--policy", "round_robin", "--disable-retries", "--model-path", str(QWEN3)]


def _engine(runtime: str, dp_size: int, *extra: str) -> Spawned:
    return spawn_engine(runtime, model_path=QWEN3, extra=["--served-model-name", MODEL, "--dp-size", str(dp_size),
                                                          *extra])


def _ranks_received(control: EngineControl) -> list[int | None]:
    return [request.get("data_parallel_rank") for request in control.received()]


def _routed(journal: Path, reply: httpx.Response) -> list[Routed]:
    assert reply.status_code == 200, reply.text
    return [e for e in wait_for_events(journal, reply.headers["x-request-id"]) if isinstance(e, Routed)]


def _rank_of(worker: str | None) -> int:
    return int((worker or "").rsplit("@", 1)[1])


def eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module", params=["sglang", "vllm", "tokenspeed"])
def ranked(request: pytest.FixtureRequest) -> Iterator[tuple[Spawned, EngineControl]]:
    engine = _engine(request.param, 4, "--default-sampling-params", '{"temperature": 0.25}')
    control = EngineControl(target_of(engine.url))
    try:
        yield engine, control
    finally:
        control.close()
        engine.stop()


def test_each_rank_is_a_worker_and_each_request_is_pinned_to_its_rank(
    ranked: tuple[Spawned, EngineControl], tmp_path: Path
) -> None:
    engine, control = ranked
    journal = tmp_path / "dp.db"
    gateway = spawn_gateway([engine.url], journal=journal, extra=["--dp-aware", *ROUND_ROBIN])
    try:
        listed = httpx.get(gateway.url + "/workers").json()["workers"]
        assert sorted(w["url"] for w in listed) == [f"{engine.url}@{rank}" for rank in range(4)]
        assert {(w["dp_rank"], w["dp_size"]) for w in listed} == {(rank, 4) for rank in range(4)}
        control.reset()
        routed = [_routed(journal, httpx.post(gateway.url + "/v1/messages", json=BODY, timeout=30)) for _ in range(8)]
        received = _ranks_received(control)
        # What each request was routed to is the rank its engine request was pinned to.
        assert received == [_rank_of(r.worker) for (r,) in routed]
        assert Counter(received) == {0: 2, 1: 2, 2: 2, 3: 2}
        # Every rank is the one engine: its sampling defaults hold on each.
        assert {r["sampling_params"]["temperature"] for r in control.received()} == {0.25}
    finally:
        gateway.stop()


def test_without_dp_aware_the_engine_is_one_worker_and_no_rank_is_sent(
    ranked: tuple[Spawned, EngineControl], tmp_path: Path
) -> None:
    engine, control = ranked
    gateway = spawn_gateway([engine.url], extra=ROUND_ROBIN)
    try:
        assert [w["url"] for w in httpx.get(gateway.url + "/workers").json()["workers"]] == [engine.url]
        control.reset()
        for _ in range(2):
            reply = httpx.post(gateway.url + "/v1/messages", json=BODY, timeout=30)
            assert reply.status_code == 200, reply.text
        assert _ranks_received(control) == [None, None]
    finally:
        gateway.stop()


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
def test_each_leg_of_a_pair_is_pinned_to_its_own_rank(runtime: str, tmp_path: Path) -> None:
    # SGLang starts both legs at once under one room; vLLM prefills one token, then decodes.
    legs: dict[str, Spawned] = {}
    controls: dict[str, EngineControl] = {}
    gateway: Spawned | None = None
    try:
        for role, size in (("prefill", 2), ("decode", 3)):
            legs[role] = _engine(runtime, size, "--role", role)
            controls[role] = EngineControl(target_of(legs[role].url))
        journal = tmp_path / "pd.db"
        prefill = [legs["prefill"].url, *(["9123"] if runtime == "sglang" else [])]
        gateway = spawn_gateway(
            [],
            journal=journal,
            extra=["--pd-disaggregation", "--dp-aware", "--prefill", *prefill, "--decode", legs["decode"].url,
                   "--prefill-policy", "round_robin", "--decode-policy", "round_robin", *ROUND_ROBIN],
        )
        listed = sorted(w["url"] for w in httpx.get(gateway.url + "/workers").json()["workers"])
        assert listed == sorted([*(f"{legs['prefill'].url}@{r}" for r in range(2)),
                                 *(f"{legs['decode'].url}@{r}" for r in range(3))])
        routed = [_routed(journal, httpx.post(gateway.url + "/v1/messages", json=BODY, timeout=30)) for _ in range(6)]
        prefills, decodes = controls["prefill"].received(), controls["decode"].received()
        for (to_prefill, to_decode), first, second in zip(routed, prefills, decodes, strict=True):
            assert to_prefill.worker is not None and to_prefill.worker.startswith(legs["prefill"].url + "@")
            assert first["data_parallel_rank"] == _rank_of(to_prefill.worker)
            assert second["data_parallel_rank"] == _rank_of(to_decode.worker)
            assert first["request_id"] == second["request_id"]
            if runtime == "sglang":
                assert first["disaggregated_params"] == second["disaggregated_params"]
        assert Counter(r["data_parallel_rank"] for r in prefills) == {0: 3, 1: 3}
        assert Counter(r["data_parallel_rank"] for r in decodes) == {0: 2, 1: 2, 2: 2}
    finally:
        if gateway is not None:
            gateway.stop()
        for control in controls.values():
            control.close()
        for leg in legs.values():
            leg.stop()


def test_the_rank_policy_keeps_new_requests_off_the_rank_holding_a_long_prompt(tmp_path: Path) -> None:
    engine = _engine("sglang", 2)
    control = EngineControl(target_of(engine.url))
    journal = tmp_path / "dp.db"
    gateway: Spawned | None = None
    try:
        gateway = spawn_gateway(
            [engine.url], journal=journal, extra=["--dp-aware", "--dp-minimum-tokens-scheduler", *ROUND_ROBIN]
        )
        url = gateway.url + "/v1/messages"

        def ranks_reported() -> bool:
            # Until both ranks' GetLoads are in, the pool policy's choice stands.
            (routed,) = _routed(journal, httpx.post(url, json=BODY, timeout=30))
            return "fewest KV tokens" in routed.reason

        eventually(ranks_reported, "the gateway read both ranks' loads")
        control.reset()
        control.script({"text": "A long answer, held.", "hold_after": 1}, default={"text": "Hi."})
        long_prompt = " ".join(["word"] * 300)
        held = {**BODY, "stream": True, "messages": [{"role": "user", "content": long_prompt}]}
        with httpx.stream("POST", url, json=held, timeout=30) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            while "content_block_delta" not in next(lines):
                pass  # the held stream has its first token: its rank holds the long prompt
            (long_rank,) = _ranks_received(control)
            replies = [_routed(journal, httpx.post(url, json=BODY, timeout=30)) for _ in range(4)]
            control.release()
            for _ in lines:
                pass
        others = _ranks_received(control)[1:]
        # Round robin alone would put two of the four on the busy rank.
        assert others == [1 - long_rank] * 4
        assert all(f"dp rank {1 - long_rank}: fewest KV tokens" in routed.reason for (routed,) in replies)
    finally:
        if gateway is not None:
            gateway.stop()
        control.close()
        engine.stop()


def test_an_engine_found_dead_takes_all_its_ranks_out_at_once(tmp_path: Path) -> None:
    dead, live = _engine("sglang", 3), _engine("sglang", 2)
    journal = tmp_path / "dp.db"
    gateway: Spawned | None = None
    try:
        gateway = spawn_gateway(
            [dead.url, live.url],
            journal=journal,
            # No health check before the test is over: what takes the ranks out is the request.
            extra=["--dp-aware", "--policy", "round_robin", "--model-path", str(QWEN3),
                   "--health-check-interval-secs", "3600"],
        )  # fmt: skip
        dead.stop()
        for _ in range(5):  # round robin reaches the dead engine within a round of its five ranks
            routed = _routed(journal, httpx.post(gateway.url + "/v1/messages", json=BODY, timeout=30))
            on_dead = [r for r in routed if (r.worker or "").startswith(dead.url + "@")]
            if on_dead:
                break
        # The one address that did not answer is every rank's: one attempt found it, the retry went elsewhere.
        assert len(on_dead) == 1, [r.worker for r in routed]
        assert routed[-1].worker is not None and routed[-1].worker.startswith(live.url + "@")
        status = {w["url"]: w["status"] for w in httpx.get(gateway.url + "/workers").json()["workers"]}
        assert [status[f"{dead.url}@{rank}"] for rank in range(3)] == [status[f"{dead.url}@0"]] * 3
        assert status[f"{dead.url}@0"] != "ready" and status[f"{live.url}@0"] == "ready"
    finally:
        if gateway is not None:
            gateway.stop()
        dead.stop()
        live.stop()
