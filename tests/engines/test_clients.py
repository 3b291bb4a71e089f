"""The engine protocol clients against the scripted engine of each runtime, as real processes.

Counts and ids are checked exactly: whatever a runtime sends (SGLang running totals, vLLM
per-chunk counts, TRT-LLM's complete carrying every id, TokenSpeed's trimmed stop token, MLX's
empty complete), the gateway must see running totals, each id once, and one final `EngineDone`.
"""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from smg.backends.grpc.engines import RUNTIMES, connect
from smg.backends.grpc.types import EngineChunk, EngineClient, EngineDone, EngineError, EngineEvent, GenerateCall
from tests.engines.conftest import EngineUnderTest

PROMPT = [1, 2, 3, 4]
EOS = 4002  # the qwen3 fixture's first EOS id (generation_config.json: [4002, 4000])
TOKENS = [10, 11, 12, 13, 14]
# Runtimes whose servicer leaves a matched stop token out of the ids.
TRIMS_STOP = {"trtllm", "tokenspeed"}
# Runtimes that name the model's primary EOS as the matched token.
NAMES_EOS = {"sglang", "tokenspeed", "mlx"}


async def run(client: EngineClient, call: GenerateCall) -> tuple[list[EngineChunk], EngineDone]:
    events: list[EngineEvent] = [event async for event in client.generate(call)]
    assert events and isinstance(events[-1], EngineDone), events
    assert all(isinstance(e, EngineChunk) for e in events[:-1]), events
    return [e for e in events[:-1] if isinstance(e, EngineChunk)], events[-1]


def call(request_id: str = "req-1", **fields: Any) -> GenerateCall:
    return GenerateCall(request_id=request_id, input_ids=list(PROMPT), text="prompt", **fields)


def shape(chunks: list[EngineChunk]) -> list[tuple[list[int], int]]:
    return [(c.token_ids, c.completion_tokens) for c in chunks]


# --- discovery ---------------------------------------------------------------------------------


async def test_model_info(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    info = await engine_client.model_info()
    assert info.model_id == f"tiny-{engine.runtime}"
    assert info.max_context_length == 40960
    assert info.vocab_size == 4014
    # TRT-LLM's model info has no EOS ids and no model type; the gateway reads its files.
    assert info.eos_token_ids == ([] if engine.runtime == "trtllm" else [4002, 4000])
    assert info.model_type == ("" if engine.runtime == "trtllm" else "qwen3")
    assert info.default_sampling == {}


async def test_model_info_without_a_served_name_and_with_defaults(flagged: EngineUnderTest) -> None:
    client = connect("vllm", flagged.url)
    try:
        info = await client.model_info()
    finally:
        await client.close()
    assert info.model_id == info.model_path == str(Path("tests/fixtures/qwen3").resolve())
    assert info.max_context_length == 16
    assert info.eos_token_ids == [4000]
    assert info.default_sampling == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


async def test_health_follows_the_engine(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    assert await engine_client.health() is True
    engine.control.health(False)
    assert await engine_client.health() is False
    engine.control.health(True)
    assert await engine_client.health() is True


async def test_server_info_is_a_dict(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    info = await engine_client.server_info()
    expected = {
        "sglang": "sglang_version",
        "vllm": "server_type",
        "trtllm": "backend",
        "tokenspeed": "tokenspeed_version",
        "mlx": "server_type",
    }[engine.runtime]
    assert expected in info


async def test_nothing_listening_is_unavailable() -> None:
    client = connect("sglang", "grpc://127.0.0.1:1")
    try:
        with pytest.raises(EngineError) as caught:
            await client.health()
    finally:
        await client.close()
    assert caught.value.code == "UNAVAILABLE"
    assert caught.value.unavailable


def test_connect_knows_the_five_runtimes() -> None:
    assert RUNTIMES == ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")
    with pytest.raises(ValueError, match="unknown gRPC engine runtime"):
        connect("ollama", "127.0.0.1:1")


# --- generation ----------------------------------------------------------------------------------


async def test_streaming_gives_running_totals_and_each_id_once(
    engine: EngineUnderTest, engine_client: EngineClient
) -> None:
    engine.control.script({"token_ids": TOKENS, "chunk_size": 2})
    chunks, done = await run(engine_client, call(max_tokens=100))

    trimmed = engine.runtime in TRIMS_STOP
    last = [14] if trimmed else [14, EOS]
    # TokenSpeed counts the stop token it trims; TRT-LLM leaves it out of the count as well.
    last_count = 5 if engine.runtime == "trtllm" else 6
    assert shape(chunks) == [([10, 11], 2), ([12, 13], 4), (last, last_count)]
    assert all(c.prompt_tokens == len(PROMPT) for c in chunks)
    assert done.token_ids == []
    assert done.finish_reason == "stop"
    assert done.completion_tokens == last_count
    assert done.prompt_tokens == len(PROMPT)
    assert done.matched_token_id == (EOS if engine.runtime in NAMES_EOS else None)
    assert done.matched_stop_str is None


async def test_non_streaming_gives_every_id_in_the_done(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script({"token_ids": TOKENS, "chunk_size": 2})
    chunks, done = await run(engine_client, call(max_tokens=100, stream=False))
    assert chunks == []
    assert done.token_ids == (TOKENS if engine.runtime in TRIMS_STOP else [*TOKENS, EOS])
    assert done.completion_tokens == (5 if engine.runtime == "trtllm" else 6)
    assert done.finish_reason == "stop"


async def test_default_script_is_the_default_text(
    engine: EngineUnderTest, engine_client: EngineClient, tokenizer: Any
) -> None:
    chunks, done = await run(engine_client, call(max_tokens=100, stream=False))
    text = tokenizer.decode(done.token_ids, skip_special_tokens=True)
    assert text == "Hello! I am the scripted engine, answering over gRPC."


async def test_text_is_encoded_with_the_model_tokenizer(
    engine: EngineUnderTest, engine_client: EngineClient, tokenizer: Any
) -> None:
    engine.control.script({"text": "Hi there, friend", "eos": False})
    chunks, done = await run(engine_client, call(max_tokens=100))
    ids = [t for c in chunks for t in c.token_ids] + done.token_ids
    assert ids == tokenizer.encode("Hi there, friend", add_special_tokens=False)
    assert [c.completion_tokens for c in chunks] == list(range(1, len(ids) + 1))
    # Out of text without an EOS: the engine stops without naming a match.
    assert (done.finish_reason, done.matched_token_id, done.completion_tokens) == ("stop", None, len(ids))


async def test_max_tokens_ends_with_length(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script({"token_ids": TOKENS})
    chunks, done = await run(engine_client, call(max_tokens=3))
    assert shape(chunks) == [([10], 1), ([11], 2), ([12], 3)]
    assert (done.finish_reason, done.completion_tokens, done.token_ids) == ("length", 3, [])
    assert done.matched_token_id is None and done.matched_stop_str is None

    engine.control.script({"token_ids": TOKENS})
    _, done = await run(engine_client, call("req-2", max_tokens=3, stream=False))
    assert (done.finish_reason, done.completion_tokens, done.token_ids) == ("length", 3, [10, 11, 12])


async def test_stop_token_id_names_the_match(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script({"token_ids": TOKENS})
    chunks, done = await run(engine_client, call(max_tokens=100, stop_token_ids=[12]))
    if engine.runtime in TRIMS_STOP:
        assert shape(chunks) == [([10], 1), ([11], 2)]
    else:
        assert shape(chunks) == [([10], 1), ([11], 2), ([12], 3)]
    assert done.finish_reason == "stop"
    assert done.matched_token_id == 12
    assert done.completion_tokens == (2 if engine.runtime == "trtllm" else 3)


@pytest.mark.parametrize("runtime", ["vllm", "trtllm", "tokenspeed"])
async def test_engines_that_take_stop_strings_report_the_match(
    runtime: str, engines: dict[str, Any], tokenizer: Any
) -> None:
    from tools.engine_control import EngineControl

    url = engines[runtime].url
    with EngineControl(url) as control:
        control.reset()
        control.script({"text": "Hello STOP world"})
        client = connect(runtime, url)
        try:
            chunks, done = await run(client, call(max_tokens=100, stop=["STOP"]))
        finally:
            await client.close()
        sent = control.received()[0]
    ids = [t for c in chunks for t in c.token_ids] + done.token_ids
    text = tokenizer.decode(ids)
    assert (done.finish_reason, done.matched_stop_str, done.matched_token_id) == ("stop", "STOP", None)
    assert text.startswith("Hello") and text.endswith("STOP") and "world" not in text
    assert done.completion_tokens == len(ids)
    params = sent["sampling_params"] if runtime != "trtllm" else sent
    assert params["stop"] == ["STOP"]


async def test_sglang_never_gets_stop_strings(sglang: EngineUnderTest) -> None:
    client = connect("sglang", sglang.url)
    sglang.control.script({"text": "Hello STOP world"})
    try:
        _, done = await run(client, call(max_tokens=100, stop=["STOP"], stop_token_ids=[7]))
    finally:
        await client.close()
    params = sglang.control.received()[0]["sampling_params"]
    assert "stop" not in params
    assert params["stop_token_ids"] == [7]
    assert done.matched_token_id == EOS and done.matched_stop_str is None


async def test_script_overrides_counts_and_finish(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script(
        {
            "token_ids": [10, 11],
            "eos": False,
            "prompt_tokens": 99,
            "cached_tokens": 7,
            "finish_reason": "tool_calls",
            "matched_stop": "</tool_call>",
        }
    )
    chunks, done = await run(engine_client, call(max_tokens=100))
    assert [(c.prompt_tokens, c.cached_tokens) for c in chunks] == [(99, 7), (99, 7)]
    assert (done.prompt_tokens, done.cached_tokens, done.finish_reason) == (99, 7, "tool_calls")
    if engine.runtime == "mlx":  # MLX's complete can name a token id only
        assert done.matched_stop_str is None
    else:
        assert done.matched_stop_str == "</tool_call>"


async def test_scripts_are_taken_in_order_then_the_default(
    engine: EngineUnderTest, engine_client: EngineClient
) -> None:
    engine.control.script({"token_ids": [20]}, {"token_ids": [21]}, default={"token_ids": [22], "eos": False})
    answers = []
    for n in range(4):
        _, done = await run(engine_client, call(f"req-{n}", stream=False))
        answers.append(done.token_ids[0])
    assert answers == [20, 21, 22, 22]
    assert [r["request_id"] for r in engine.control.received()] == ["req-0", "req-1", "req-2", "req-3"]


# --- failures ------------------------------------------------------------------------------------


async def test_error_before_the_first_token(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script({"token_ids": TOKENS, "error": {"code": "INVALID_ARGUMENT", "message": "bad prompt"}})
    events: list[EngineEvent] = []
    with pytest.raises(EngineError) as caught:
        async for event in engine_client.generate(call(max_tokens=100)):
            events.append(event)
    assert events == []
    assert (caught.value.code, caught.value.message) == ("INVALID_ARGUMENT", "bad prompt")
    assert not caught.value.unavailable


async def test_error_after_tokens_were_sent(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script(
        {"token_ids": TOKENS, "error": {"code": "INTERNAL", "message": "engine died", "after_tokens": 2}}
    )
    events: list[EngineEvent] = []
    with pytest.raises(EngineError) as caught:
        async for event in engine_client.generate(call(max_tokens=100)):
            events.append(event)
    assert [e.token_ids for e in events if isinstance(e, EngineChunk)] == [[10], [11]]
    assert (caught.value.code, caught.value.message) == ("INTERNAL", "engine died")


async def test_prompt_over_the_context_window_is_refused(flagged: EngineUnderTest) -> None:
    client = connect("vllm", flagged.url)
    try:
        with pytest.raises(EngineError) as caught:
            await run(client, GenerateCall("long", list(range(17)), max_tokens=4))
        _, done = await run(client, GenerateCall("fits", list(range(16)), max_tokens=2))
    finally:
        await client.close()
    assert caught.value.code == "INVALID_ARGUMENT"
    assert "longer than the maximum model length of 16" in caught.value.message
    assert done.finish_reason == "length"
    # The refused prompt was received, but took no script.
    assert [r["request_id"] for r in flagged.control.received()] == ["long", "fits"]


# --- abort and cancellation ----------------------------------------------------------------------


async def test_abort_ends_the_stream(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script({"token_ids": TOKENS, "hold_after": 2})
    stream = engine_client.generate(call("to-abort", max_tokens=100))
    first = [await anext(stream), await anext(stream)]
    await engine_client.abort("to-abort")
    rest = [event async for event in stream]
    assert [e.token_ids for e in first if isinstance(e, EngineChunk)] == [[10], [11]]
    assert len(rest) == 1 and isinstance(rest[0], EngineDone)
    assert rest[0].finish_reason == "abort"
    assert rest[0].completion_tokens == 2
    assert rest[0].token_ids == []
    assert engine.control.aborts() == ["to-abort"]


async def test_closing_the_stream_early_cancels_the_rpc(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script({"token_ids": TOKENS, "hold_after": 1})
    stream = engine_client.generate(call("to-drop", max_tokens=100))
    first = await anext(stream)
    assert isinstance(first, EngineChunk) and first.token_ids == [10]
    assert isinstance(stream, AsyncGenerator)
    await stream.aclose()
    for _ in range(1500):  # the engine learns of the cancellation asynchronously (slowly on a busy machine)
        if engine.control.cancelled():
            break
        await asyncio.sleep(0.02)
    received = [r.get("request_id") for r in engine.control.received()]
    assert engine.control.cancelled() == ["to-drop"], (received, engine.control.aborts())
    assert engine.control.aborts() == []  # the caller sends Abort itself


async def test_release_lets_a_held_stream_go_on(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    engine.control.script({"token_ids": [10, 11], "eos": False, "hold_after": 1})
    stream = engine_client.generate(call(max_tokens=100))
    assert isinstance(await anext(stream), EngineChunk)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.1)
    assert not pending.done()
    engine.control.release()
    second = await asyncio.wait_for(pending, 5)
    assert isinstance(second, EngineChunk) and second.token_ids == [11]
    rest = [event async for event in stream]
    assert len(rest) == 1 and isinstance(rest[0], EngineDone) and rest[0].completion_tokens == 2


# --- the tokenizer bundle ------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_tokenizer_bundle_round_trip(
    runtime: str, engines: dict[str, Any], tokenizer: Any, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    client = connect(runtime, engines[runtime].url)
    try:
        bundle = await client.tokenizer_bundle()
    finally:
        await client.close()
    with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"} <= names
    assert "chat_template.jinja" in names
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "Hello! I am the scripted engine."
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)


async def test_tokenizer_bundle_refused(flagged: EngineUnderTest) -> None:
    client = connect("vllm", flagged.url)
    try:
        with pytest.raises(EngineError) as caught:
            await client.tokenizer_bundle()
    finally:
        await client.close()
    assert caught.value.code == "FAILED_PRECONDITION"


# --- what the engine receives --------------------------------------------------------------------


async def test_neutral_sampling_defaults(engine: EngineUnderTest, engine_client: EngineClient) -> None:
    await run(engine_client, call(max_tokens=64))
    sent = engine.control.received()[0]
    assert sent["request_id"] == "req-1"
    if engine.runtime == "trtllm":
        config = sent["sampling_config"]
        assert "top_k" not in config  # unset: TRT-LLM's "disabled"
        assert (config["temperature"], config["top_p"], config["repetition_penalty"]) == (1.0, 1.0, 1.0)
        assert (config["beam_width"], config["num_return_sequences"]) == (1, 1)
        assert sent["output_config"] == {"exclude_input_from_output": True}
        assert (sent["max_tokens"], sent["streaming"]) == (64, True)
        assert sent["tokenized"]["input_token_ids"] == PROMPT
        return
    params = sent["sampling_params"]
    assert sent["tokenized"]["input_ids"] == PROMPT
    assert sent["stream"] is True
    assert (params["temperature"], params["top_p"], params["repetition_penalty"]) == (1.0, 1.0, 1.0)
    # MessageToDict leaves out zeros: vLLM's and MLX's top_k 0 is "disabled".
    assert params.get("top_k", 0) == {"sglang": -1, "tokenspeed": -1, "vllm": 0, "mlx": 0}[engine.runtime]
    max_field = "max_new_tokens" if engine.runtime in ("sglang", "tokenspeed") else "max_tokens"
    assert params[max_field] == 64
    assert "stop" not in params and "stop_token_ids" not in params
    if engine.runtime != "mlx":
        assert params["skip_special_tokens"] is True
        assert params["spaces_between_special_tokens"] is True
        assert params["n"] == 1
    if engine.runtime == "sglang":
        assert sent["logprob_start_len"] == -1
        assert "require_reasoning" not in sent


async def test_request_values_and_constraint_reach_sglang(sglang: EngineUnderTest) -> None:
    client = connect("sglang", sglang.url)
    try:
        await run(
            client,
            call(
                max_tokens=32,
                temperature=0.25,
                top_p=0.5,
                top_k=20,
                min_p=0.125,
                repetition_penalty=1.5,
                stop_token_ids=[7, 8],
                constraint=("ebnf", 'root ::= "yes"'),
                require_reasoning=True,
                stream=False,
            ),
        )
    finally:
        await client.close()
    sent = sglang.control.received()[0]
    params = sent["sampling_params"]
    assert (params["temperature"], params["top_p"], params["top_k"], params["min_p"]) == (0.25, 0.5, 20, 0.125)
    assert (params["repetition_penalty"], params["max_new_tokens"]) == (1.5, 32)
    assert params["stop_token_ids"] == [7, 8]
    assert params["ebnf_grammar"] == 'root ::= "yes"'
    assert sent["require_reasoning"] is True
    assert "stream" not in sent  # false
    assert sent["tokenized"]["original_text"] == "prompt"


async def test_request_values_and_constraint_reach_vllm(vllm: EngineUnderTest) -> None:
    client = connect("vllm", vllm.url)
    try:
        await run(
            client,
            call(
                max_tokens=32,
                temperature=0.0,
                top_k=-1,
                stop=["END"],
                constraint=("ebnf", 'root ::= "yes"'),
                require_reasoning=True,
            ),
        )
        await run(client, call("req-2", constraint=("json_schema", '{"type": "object"}')))
    finally:
        await client.close()
    first, second = vllm.control.received()
    params = first["sampling_params"]
    assert params["temperature"] == 0.0  # optional field: a greedy 0 is sent, not dropped
    assert params.get("top_k", 0) == 0  # SGLang's -1 "disabled" is vLLM's 0
    assert (params["max_tokens"], params["stop"], params["grammar"]) == (32, ["END"], 'root ::= "yes"')
    assert "require_reasoning" not in first  # vLLM's protocol has no such field
    assert second["sampling_params"]["json_schema"] == '{"type": "object"}'
    assert "max_tokens" not in second["sampling_params"]


async def test_control_refuses_a_bad_script(engine: EngineUnderTest) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        engine.control.script({"token_ids": [1], "chunk_size": 0})
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "chunk_size" in str(caught.value.details())


async def test_chunks_already_waiting_are_handed_on_as_one(engine: EngineUnderTest) -> None:
    # A reader that falls behind the engine gets what waited as one chunk: the same ids in
    # order, the same final counts as chunk by chunk, whatever the protocol counts per chunk.
    engine.control.script({"token_ids": TOKENS, "chunk_size": 1})
    separate, merged_client = (
        connect(engine.runtime, engine.url, merge_waiting=False),
        connect(engine.runtime, engine.url),
    )
    try:
        expected = await run(separate, call("one-by-one", max_tokens=100))
        engine.control.script({"token_ids": TOKENS, "chunk_size": 1, "hold_after": 1})
        stream = merged_client.generate(call("merged", max_tokens=100))
        first = await anext(stream)
        assert isinstance(first, EngineChunk) and first.token_ids == [10]
        await asyncio.sleep(0.2)  # the engine is at its hold (a release before it would be missed)
        engine.control.release()
        await asyncio.sleep(0.5)  # the rest arrives while nobody reads
        rest = await asyncio.wait_for(_rest(stream), 20)
    finally:
        await separate.close()
        await merged_client.close()
    chunks, done = [first, *(e for e in rest if isinstance(e, EngineChunk))], rest[-1]
    assert len(chunks) == 2 and isinstance(done, EngineDone)
    assert [t for c in chunks for t in c.token_ids] == [t for c in expected[0] for t in c.token_ids]
    assert chunks[-1].completion_tokens == expected[0][-1].completion_tokens
    assert (done.completion_tokens, done.finish_reason, done.token_ids) == (
        expected[1].completion_tokens,
        expected[1].finish_reason,
        expected[1].token_ids,
    )


async def test_a_call_that_must_not_be_merged_keeps_every_chunk(engine: EngineUnderTest) -> None:
    # A request with stop sequences: the usage is the engine's count at the matching chunk.
    engine.control.script({"token_ids": TOKENS, "chunk_size": 1, "hold_after": 1})
    client = connect(engine.runtime, engine.url)
    try:
        stream = client.generate(call("kept", max_tokens=100, merge_chunks=False))
        first = await anext(stream)
        await asyncio.sleep(0.2)  # the engine is at its hold (a release before it would be missed)
        engine.control.release()
        await asyncio.sleep(0.5)  # the rest waits unread
        rest = await asyncio.wait_for(_rest(stream), 20)
    finally:
        await client.close()
    chunks = [first, *(e for e in rest if isinstance(e, EngineChunk))]
    assert [c.token_ids for c in chunks][:4] == [[10], [11], [12], [13]]


async def _rest(stream: AsyncIterator[EngineEvent]) -> list[EngineEvent]:
    return [event async for event in stream]
