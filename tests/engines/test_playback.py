"""The playback engine itself: what a script makes of a call, what it records, and a journaled
generation played back as it was."""

from __future__ import annotations

import asyncio

import pytest

from journal.events import Tokens
from smg.backends.grpc.engines.playback import PlaybackEngine, Recording, Script
from smg.backends.grpc.types import EngineChunk, EngineDone, EngineError, EngineEvent, GenerateCall

EOS = 9


def _engine() -> PlaybackEngine:
    return PlaybackEngine("m", eos_token_ids=[EOS])


def _call(**fields: object) -> GenerateCall:
    return GenerateCall(request_id=str(fields.pop("request_id", "r1")), input_ids=[1, 2, 3], **fields)  # type: ignore[arg-type]


async def _answers(engine: PlaybackEngine, call: GenerateCall) -> list[EngineEvent]:
    return [event async for event in engine.generate(call)]


async def test_chunks_carry_new_ids_and_running_totals_then_one_done() -> None:
    engine = _engine()
    engine.script({"token_ids": [5, 6, 7], "chunk_size": 2})
    answers = await _answers(engine, _call())
    assert answers == [
        EngineChunk([5, 6], 3, 2),
        EngineChunk([7, EOS], 3, 4),
        EngineDone("stop", 3, 4, [], matched_token_id=EOS),
    ]
    assert engine.received[0].request_id == "r1" and engine.cancelled == []


async def test_the_call_decides_where_it_stops_and_a_whole_answer_comes_in_the_done() -> None:
    engine = _engine()
    engine.script({"token_ids": [5, 6, 7, 8], "eos": False}, {"token_ids": [5, 6, 7]})
    [done] = await _answers(engine, _call(max_tokens=2, stream=False))
    assert done == EngineDone("length", 3, 2, [5, 6])
    answers = await _answers(engine, _call(stop_token_ids=[6]))
    assert answers[-1] == EngineDone("stop", 3, 2, [], matched_token_id=6)


async def test_an_error_after_some_tokens_and_a_crash_that_takes_the_engine_down() -> None:
    engine = _engine()
    engine.script(
        {"token_ids": [5, 6, 7], "error": {"code": "resource_exhausted", "message": "full", "after_tokens": 1}},
        {"token_ids": [5, 6, 7], "exit_after": 2},
    )
    seen: list[EngineEvent] = []
    with pytest.raises(EngineError) as failed:
        async for event in engine.generate(_call()):
            seen.append(event)
    assert failed.value.code == "RESOURCE_EXHAUSTED" and seen == [EngineChunk([5], 3, 1)]
    with pytest.raises(EngineError) as crashed:
        await _answers(engine, _call())
    assert crashed.value.unavailable and engine.down
    with pytest.raises(EngineError):
        await engine.health()
    engine.revive()
    assert await engine.health()
    # A call answered whole (not streamed) fails the same, before its one answer.
    engine.script({"token_ids": [5, 6, 7], "error": {"code": "INTERNAL", "after_tokens": 2}})
    with pytest.raises(EngineError) as whole:
        await _answers(engine, _call(stream=False))
    assert whole.value.code == "INTERNAL"


async def test_a_held_stream_waits_for_release_and_one_left_early_is_recorded() -> None:
    engine = _engine()
    engine.script({"token_ids": [5, 6, 7], "hold_after": 1}, {"token_ids": [5, 6, 7], "hold_after": 1})
    reading = asyncio.create_task(_answers(engine, _call()))
    await engine.held.wait()
    engine.release()
    assert len(await reading) == 5  # four tokens (EOS last), one at a time, then the done
    left = engine.generate(_call(request_id="r2"))
    assert await anext(left) == EngineChunk([5], 3, 1)
    await left.aclose()  # type: ignore[attr-defined]
    await engine.abort("r2")
    assert engine.cancelled == ["r2"] and engine.aborts == ["r2"]


async def test_a_recording_plays_the_journaled_chunks_back_whatever_the_call() -> None:
    events = [
        Tokens(ids=[5, 6], prompt_tokens=3, completion_tokens=2),
        Tokens(ids=[], prompt_tokens=3, completion_tokens=2, finish_reason="stop", matched_stop="END"),
    ]
    engine = _engine()
    engine.script(Recording.from_events(events))
    answers = await _answers(engine, _call(max_tokens=1))
    assert answers == [EngineChunk([5, 6], 3, 2), EngineDone("stop", 3, 2, [], matched_stop_str="END")]
    with pytest.raises(ValueError):
        Recording.from_events(events[:1])


def test_a_script_in_the_scripted_engines_format_is_checked() -> None:
    assert Script.parse({"text": "hi", "repeat": True}).repeat
    with pytest.raises(ValueError):
        Script.parse({"delay_ms": 10})  # a test waits on events, not on time
    with pytest.raises(ValueError):
        Script.parse({"text": "a", "token_ids": [1]})


def test_the_script_parser_checks_values_and_leaves_a_callers_own_keys_to_it() -> None:
    assert Script.parse({"text": "a", "delay_ms": 5}, extra_keys=frozenset({"delay_ms"})).text == "a"
    failure = Script.parse({"error": {"code": "invalid_argument", "after_tokens": 2}}).error
    assert failure is not None and (failure.code, failure.after_tokens) == ("INVALID_ARGUMENT", 2)
    for bad, message in [
        ({"error": {"code": "NOPE"}}, "is not a gRPC status name"),
        ({"error": {"code": "OK"}}, "cannot be OK"),
        ({"eos": 1}, "eos must be a boolean"),
        ({"chunk_size": 0}, "chunk_size must be an integer of at least 1"),
        ({"token_ids": [1, -2]}, "token_ids must be a list of non-negative integers"),
        ([], "a script must be a JSON object"),
    ]:
        with pytest.raises(ValueError, match=message):
            Script.parse(bad)
