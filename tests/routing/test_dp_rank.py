"""The data-parallel rank policy (`--dp-minimum-tokens-scheduler`) without sockets: which rank of
the chosen engine serves, what it is charged, and a dispatch's attempts with it."""

from __future__ import annotations

from collections.abc import Sequence

from smg.routing.dispatch import Dispatch
from smg.routing.policies import RouteContext, make_policy
from smg.routing.policies.base import Choice
from smg.routing.policies.dp_rank import MinimumTokensPolicy, estimated_cost
from smg.routing.retry import RetryConfig
from smg.routing.workers import Worker, worker_kind

ENGINE = "grpc://127.0.0.1:1"
OTHER = "grpc://127.0.0.1:2"


def _rank(url: str, rank: int | None, tokens: int | None) -> Worker:
    worker = Worker(url=url, connection=worker_kind(url), dp_rank=rank, dp_size=None if rank is None else 4)
    worker.discovered_as({"m": 4096}, True)
    worker.kv_tokens = tokens
    return worker


def _engine(url: str, *tokens: int | None) -> list[Worker]:
    return [_rank(url, rank, t) for rank, t in enumerate(tokens)]


def test_the_rank_with_fewest_tokens_of_the_chosen_engine_serves_and_is_charged_the_cost() -> None:
    ranks = _engine(ENGINE, 900, 100, 400, 100)
    choice = MinimumTokensPolicy().choose_rank(Choice(ranks[0], "round robin"), ranks, cost=50)
    # 100 on ranks 1 and 3: the lower rank wins the tie.
    assert choice.worker is ranks[1]
    assert [w.kv_tokens for w in ranks] == [900, 150, 400, 100]
    assert choice.reason == "round robin; dp rank 1: fewest KV tokens (100, of 4 ranks)"


def test_what_was_sent_counts_until_the_next_report_replaces_it() -> None:
    policy = MinimumTokensPolicy()
    ranks = _engine(ENGINE, 0, 0)
    picked = [policy.choose_rank(Choice(ranks[0], ""), ranks, cost=10).worker.dp_rank for _ in range(5)]
    assert picked == [0, 1, 0, 1, 0]
    assert [w.kv_tokens for w in ranks] == [30, 20]
    ranks[0].kv_tokens, ranks[1].kv_tokens = 5, 500  # the next GetLoads
    assert policy.choose_rank(Choice(ranks[1], ""), ranks, cost=1).worker is ranks[0]


def test_only_ranks_of_the_chosen_engine_are_candidates() -> None:
    mine, other = _engine(ENGINE, 300, 200), _engine(OTHER, 0, 0)
    choice = MinimumTokensPolicy().choose_rank(Choice(mine[0], ""), [*mine, *other], cost=1)
    assert choice.worker is mine[1]


def test_the_pool_choice_stands_without_ranks_or_reports() -> None:
    policy = MinimumTokensPolicy()
    plain = _rank(ENGINE, None, 0)  # not a rank (no --dp-aware)
    assert policy.choose_rank(Choice(plain, "x"), [plain], cost=1) == Choice(plain, "x")
    silent = _engine(ENGINE, None, None)  # an engine without GetLoads, or before the first poll
    assert policy.choose_rank(Choice(silent[1], "x"), silent, cost=1) == Choice(silent[1], "x")
    assert [w.kv_tokens for w in silent] == [None, None]


def test_the_cost_is_the_words_times_1_3_at_least_one_token() -> None:
    assert estimated_cost("") == 1
    assert estimated_cost("one") == 2
    assert estimated_cost("a b c d e f g h i j") == 13


def _dispatch(workers: Sequence[Worker], cost: int) -> Dispatch:
    return Dispatch(
        backend="grpc",
        model="m",
        workers=workers,
        policy=make_policy("round_robin"),
        context=RouteContext(model="m", cost=cost),
        retry=RetryConfig(max_retries=3, initial_backoff_ms=0, max_backoff_ms=0),
        on_idle=lambda _: None,
        ranks=MinimumTokensPolicy(),
    )


async def test_a_dispatch_leases_the_rank_the_policy_picks_and_journals_why() -> None:
    ranks = _engine(ENGINE, 700, 20, 0)
    attempts = _dispatch(ranks, cost=30).attempts()
    lease = await anext(attempts)
    assert lease.target is ranks[2]
    assert lease.routed.worker == f"{ENGINE}@2" and lease.routed.policy == "round_robin"
    assert lease.routed.reason.endswith("; dp rank 2: fewest KV tokens (0, of 3 ranks)")
    assert ranks[2].kv_tokens == 30 and ranks[2].in_flight == 1
    lease.answered(200)
    await attempts.aclose()
    assert ranks[2].in_flight == 0


async def test_a_retry_goes_to_the_least_loaded_rank_not_yet_tried() -> None:
    ranks = _engine(ENGINE, 0, 10, 500)
    attempts = _dispatch(ranks, cost=1).attempts()
    first = await anext(attempts)
    assert first.target is ranks[0]
    first.answered(503)  # retryable: the next attempt prefers the ranks not tried
    second = await anext(attempts)
    assert second.target is ranks[1]
    second.answered(200)
    await attempts.aclose()
