"""The pure prepare step, in process: the window a prompt is refused against before a worker is
chosen, the gateway's own answers (count_tokens, `max_tokens: 0`), the prepared generation's
stops, plan and settings, and a worker's window check."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from journal.events import Block, Counted, Rendered, Routed
from smg.pipeline.generation import GenerationSettings
from smg.pipeline.prepare import (
    RENDER_INLINE_BYTES,
    check_untokenized,
    check_window,
    count_answer,
    empty_answer,
    prepare,
    refusal_window,
    settings_record,
    stop_token_map,
)
from smg.pipeline.render import render_prompt
from smg.protocol.errors import ApiError
from smg.protocol.parse import parse_create_message
from tests.pipeline import _toy

MODEL = "qwen3-fixture"
WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def request(**fields: Any) -> Any:
    body = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_create_message(body)


@pytest.mark.parametrize(
    ("windows", "endpoint", "generating", "within"),
    [
        ([], "messages", True, None),
        ([100, 400], "messages", True, 400),  # the largest window may take a generation
        ([100, 400], "messages", False, 100),  # `max_tokens: 0` answers within the smallest
        ([100, 400], "count_tokens", False, None),  # counted whatever the length
    ],
)
def test_refusal_window(windows: list[int], endpoint: str, generating: bool, within: int | None) -> None:
    assert refusal_window(windows, endpoint=endpoint, generating=generating) == within


@pytest.mark.parametrize(
    ("within", "body_bytes", "refused"),
    [
        (10, RENDER_INLINE_BYTES + 1, True),  # long body, user text alone over the window
        (10, RENDER_INLINE_BYTES, False),  # short bodies are rendered and checked exactly
        (None, RENDER_INLINE_BYTES + 1, False),
        (100_000, RENDER_INLINE_BYTES + 1, False),
    ],
)
def test_check_untokenized(within: int | None, body_bytes: int, refused: bool) -> None:
    tokenizer = _toy.fixture("qwen3")
    req = request(messages=[{"role": "user", "content": "word " * 20_000}])
    if refused:
        with pytest.raises(ApiError) as caught:
            check_untokenized(tokenizer, req, within, body_bytes)
        assert caught.value.code == "context_length_exceeded"
    else:
        check_untokenized(tokenizer, req, within, body_bytes)


def test_count_tokens_is_answered_without_a_worker() -> None:
    tokenizer = _toy.fixture("qwen3")
    prompt = render_prompt(tokenizer, request())
    routed, rendered, counted = count_answer("grpc", MODEL, prompt, "src")
    assert isinstance(routed, Routed) and routed.worker is None and routed.backend == "grpc"
    assert isinstance(rendered, Rendered) and rendered.settings is None and rendered.tokenizer == "src"
    assert isinstance(counted, Counted) and counted.input_tokens == len(prompt.ids)


@pytest.mark.parametrize(("windows", "refused"), [([], False), ([1000, 4], True), ([1000], False)])
def test_max_tokens_zero_is_answered_within_the_smallest_window(windows: list[int], refused: bool) -> None:
    tokenizer = _toy.fixture("qwen3")
    prompt = render_prompt(tokenizer, request(max_tokens=0))
    if refused:
        with pytest.raises(ApiError) as caught:
            empty_answer("zmq", MODEL, True, prompt, None, "msg_z", windows)
        assert caught.value.code == "context_length_exceeded"
        return
    events = empty_answer("zmq", MODEL, True, prompt, None, "msg_z", windows)
    assert [type(e) for e in events[:2]] == [Routed, Rendered]
    rendered = events[1]
    assert isinstance(rendered, Rendered) and rendered.settings is not None
    assert rendered.settings["message_id"] == "msg_z" and rendered.settings["stream"] is True
    blocks = [e.event["type"] for e in events[2:] if isinstance(e, Block)]
    assert blocks[0] == "message_start" and blocks[-1] == "message_stop"


@pytest.mark.parametrize(
    ("fields", "stop_ids_expected", "tool_parser"),
    [
        ({}, {}, None),
        ({"stop_sequences": ["<|im_end|>", "two words"]}, "im_end", None),  # only one-token stops map
        ({"tools": [WEATHER]}, {}, "qwen"),  # detected from the model id
    ],
)
def test_prepare(fields: dict[str, Any], stop_ids_expected: Any, tool_parser: str | None) -> None:
    tokenizer = _toy.fixture("qwen3")
    req = request(**fields)
    prompt = render_prompt(tokenizer, req)
    prepared = prepare(req, MODEL, True, tokenizer, prompt, "msg_p", "src", tool_parser=None, reasoning_parser=None)
    if stop_ids_expected == "im_end":
        stop_ids_expected = {tokenizer.token_id("<|im_end|>"): "<|im_end|>"}
    assert prepared.stop_ids == stop_ids_expected == prepared.settings.stop_token_map
    assert prepared.settings.stop_sequences == list(req.stop_sequences or [])
    assert prepared.settings.message_id == "msg_p" and prepared.settings.stream is True
    assert prepared.settings.eos_token_ids == []  # the session adds the engine's and the tokenizer's
    assert prepared.plan.tool_parser == prepared.settings.tool_parser == tool_parser
    assert prepared.images == []


def test_stop_token_map_keeps_the_first_string_of_a_token() -> None:
    tokenizer = _toy.fixture("qwen3")
    token = tokenizer.token_id("<|im_end|>")
    assert stop_token_map(tokenizer, ["<|im_end|>", "<|im_end|>"]) == {token: "<|im_end|>"}


@pytest.mark.parametrize(("window", "refused"), [(None, False), (10_000, False), (3, True)])
def test_check_window(window: int | None, refused: bool) -> None:
    tokenizer = _toy.fixture("qwen3")
    req = request()
    prepared = prepare(
        req, MODEL, False, tokenizer, render_prompt(tokenizer, req), "m", None, tool_parser=None, reasoning_parser=None
    )
    if refused:
        with pytest.raises(ApiError) as caught:
            check_window(prepared, window)
        assert caught.value.status == 400 and caught.value.code == "context_length_exceeded"
    else:
        check_window(prepared, window)


def test_the_settings_record_is_every_field_in_order_copied() -> None:
    settings = GenerationSettings(
        message_id="msg_1",
        model="m",
        stream=True,
        stop_sequences=["END", "x"],
        stop_token_map={7: "END"},
        eos_token_ids=[1, 2],
        tool_parser="qwen",
        reasoning_parser="qwen3",
        in_reasoning=True,
        forced_tool="get_weather",
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        display_omitted=True,
    )
    record = settings_record(settings)
    expected = {**dataclasses.asdict(settings), "stop_token_map": {"7": "END"}}
    assert list(record) == [f.name for f in dataclasses.fields(GenerationSettings)]
    assert orjson.dumps(record) == orjson.dumps(expected)
    assert settings.tools is not None
    settings.tools[0]["function"]["name"] = "changed"
    settings.stop_sequences.append("later")
    assert record["tools"][0]["function"]["name"] == "get_weather"
    assert record["stop_sequences"] == ["END", "x"]
