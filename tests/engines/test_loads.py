"""`loads()` against the scripted engine of each runtime: the in-flight count it reports goes up
while streams are held open and back down as they end; TRT-LLM and MLX have no `GetLoads`."""

from __future__ import annotations

from smg_grpc_proto.generated import sglang_scheduler_pb2, vllm_engine_pb2

from smg.backends.grpc.engines.base import engine_load
from smg.backends.grpc.types import EngineChunk, EngineClient, EngineDone, EngineLoad, GenerateCall, RankLoad
from tests.engines.conftest import EngineUnderTest

PROMPT = [1, 2, 3, 4]
KV_CACHE_TOKENS = 65536  # the scripted engine's fixed cache
NO_LOADS = {"trtllm", "mlx"}


def held(request_id: str) -> GenerateCall:
    return GenerateCall(request_id=request_id, input_ids=list(PROMPT), max_tokens=100)


async def test_loads_follow_the_streams_in_flight(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    if engine.runtime in NO_LOADS:
        assert await engine_client.loads() is None
        return
    idle = await engine_client.loads()
    assert idle == EngineLoad(
        running_requests=0,
        waiting_requests=0,
        max_total_tokens=KV_CACHE_TOKENS,
        max_running_requests=128,
        ranks=(RankLoad(0, requests=0, used_tokens=0),),
    )

    engine.control.script(
        {"token_ids": [10, 11, 12], "eos": False, "hold_after": 1},
        {"token_ids": [20, 21, 22], "eos": False, "hold_after": 2, "chunk_size": 2},
    )
    first = engine_client.generate(held("first"))
    assert isinstance(await anext(first), EngineChunk)
    one = await engine_client.loads()
    assert one is not None
    assert (one.running_requests, one.used_tokens) == (1, len(PROMPT) + 1)
    assert one.token_usage == (len(PROMPT) + 1) / KV_CACHE_TOKENS

    second = engine_client.generate(held("second"))
    assert isinstance(await anext(second), EngineChunk)
    two = await engine_client.loads()
    assert two is not None
    assert (two.running_requests, two.waiting_requests) == (2, 0)
    assert two.used_tokens == (len(PROMPT) + 1) + (len(PROMPT) + 2)

    await engine_client.abort("second")
    assert isinstance([e async for e in second][-1], EngineDone)
    after_abort = await engine_client.loads()
    assert after_abort is not None and after_abort.running_requests == 1

    engine.control.release()
    done = [e async for e in first][-1]
    assert isinstance(done, EngineDone) and done.completion_tokens == 3
    assert await engine_client.loads() == idle


def test_ranks_are_summed_and_their_cache_use_averaged() -> None:
    pb = sglang_scheduler_pb2
    response = pb.GetLoadsResponse(
        dp_rank_count=2,
        loads=[
            pb.SchedulerLoad(
                dp_rank=0,
                num_running_reqs=3,
                num_waiting_reqs=1,
                num_waiting_uncached_tokens=500,
                num_used_tokens=1000,
                max_total_num_tokens=4000,
                token_usage=0.25,
                gen_throughput=100.0,
                max_running_requests=64,
            ),
            pb.SchedulerLoad(
                dp_rank=1,
                num_running_reqs=5,
                num_waiting_reqs=2,
                num_used_tokens=3000,
                max_total_num_tokens=4000,
                token_usage=0.75,
                gen_throughput=50.0,
                max_running_requests=64,
            ),
        ],
    )
    assert engine_load(response) == EngineLoad(
        running_requests=8,
        waiting_requests=3,
        waiting_uncached_tokens=500,
        token_usage=0.5,
        gen_throughput=150.0,
        used_tokens=4000,
        max_total_tokens=8000,
        max_running_requests=128,
        dp_ranks=2,
        ranks=(RankLoad(0, requests=4, used_tokens=1000), RankLoad(1, requests=7, used_tokens=3000)),
    )
    # A worker pinned to a rank (--dp-aware) is loaded by its rank alone.
    assert engine_load(response).rank(1) == RankLoad(1, 7, 3000)
    assert engine_load(response).rank(None) is None and engine_load(response).rank(5) is None


def test_no_ranks_is_no_load() -> None:
    assert engine_load(vllm_engine_pb2.GetLoadsResponse()) == EngineLoad(0, 0, dp_ranks=0)
