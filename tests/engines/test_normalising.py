"""How a Generate stream's messages become running-total chunks and one done, per protocol shape,
including shapes the scripted engine does not send (MLX's abort ends with no `complete`)."""

from __future__ import annotations

from smg.backends.grpc.engines.base import RawChunk, RawComplete, _Tally, sampling_defaults, strip_scheme


def chunk(ids: list[int], count: int) -> RawChunk:
    return RawChunk(token_ids=ids, prompt_tokens=5, completion_tokens=count, cached_tokens=0)


def complete(ids: list[int], count: int, reason: str = "stop") -> RawComplete:
    return RawComplete(output_ids=ids, finish_reason=reason, prompt_tokens=5, completion_tokens=count, cached_tokens=0)


def test_delta_counts_become_running_totals_and_the_repeated_last_delta_is_not_new() -> None:
    tally = _Tally(delta_counts=True, input_len=5)
    seen = [tally.chunk(chunk([1], 1)), tally.chunk(chunk([2, 3], 2)), tally.chunk(chunk([4], 1))]
    assert [c.completion_tokens for c in seen if c] == [1, 3, 4]
    done = tally.done(complete([4], 1))  # vLLM: the last delta and its count, again
    assert (done.token_ids, done.completion_tokens) == ([], 4)


def test_a_complete_with_every_id_adds_only_the_undelivered_ones() -> None:
    tally = _Tally(delta_counts=False, input_len=5)
    tally.chunk(chunk([1, 2], 2))
    done = tally.done(complete([1, 2, 3], 3))  # TRT-LLM's cumulative ids
    assert (done.token_ids, done.completion_tokens) == ([3], 3)


def test_a_complete_after_no_chunk_carries_everything() -> None:
    done = _Tally(delta_counts=True, input_len=5).done(complete([7, 8, 9], 3))
    assert (done.token_ids, done.completion_tokens, done.prompt_tokens) == ([7, 8, 9], 3, 5)


def test_a_trimmed_stop_token_still_counts() -> None:
    tally = _Tally(delta_counts=False, input_len=5)
    tally.chunk(chunk([1, 2], 2))
    assert tally.chunk(chunk([], 3)) is None  # TokenSpeed: the trimmed stop token's tick
    done = tally.done(complete([], 3))
    assert (done.token_ids, done.completion_tokens) == ([], 3)


def test_a_stream_ending_without_complete_is_an_abort() -> None:
    tally = _Tally(delta_counts=False, input_len=5)
    tally.chunk(chunk([1], 1))
    tally.chunk(chunk([2], 2))
    done = tally.ended_without_complete()
    assert (done.finish_reason, done.completion_tokens, done.prompt_tokens, done.token_ids) == ("abort", 2, 5, [])


def test_prompt_count_falls_back_to_the_input() -> None:
    tally = _Tally(delta_counts=False, input_len=9)
    first = tally.chunk(RawChunk([1], 0, 1, 0))
    assert first is not None and first.prompt_tokens == 9


def test_sampling_defaults_prefer_the_resolved_json() -> None:
    assert sampling_defaults('{"temperature": 0.6}', '{"temperature": 0.1}') == {"temperature": 0.6}
    assert sampling_defaults("", '{"temperature": 0.1, "max_new_tokens": 9}') == {"temperature": 0.1}
    assert sampling_defaults("not json", "") == {}


def test_strip_scheme() -> None:
    assert strip_scheme("grpc://127.0.0.1:5/") == "127.0.0.1:5"
    assert strip_scheme("127.0.0.1:5") == "127.0.0.1:5"
