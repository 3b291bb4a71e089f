"""The gRPC path end to end: the anthropic SDK → the gateway → a scripted SGLang engine.

The engine's output is chosen by each test; the gateway renders, tokenizes, detokenizes,
matches stops and builds the Anthropic response itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from journal.events import Completed, Error, Rendered, Tokens
from journal.reader import JournalReader
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.projection import reconstruct
from tests.conftest import wait_for_events
from tests.grpc.conftest import MODEL, QWEN3
from tools.engine_control import EngineControl
from tools.spawn import Spawned

USER = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(QWEN3)


@pytest.fixture
def sdk(grpc_gateway: Spawned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-client", base_url=grpc_gateway.url, max_retries=0)


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in body.split("\n\n"):
        if not frame.strip():
            continue
        lines = frame.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def prompt_text(control: EngineControl, tokenizer: Tokenizer) -> str:
    sent = control.received()[-1]
    return tokenizer.decode([int(i) for i in sent["tokenized"]["input_ids"]], skip_special_tokens=False)


# --- text -------------------------------------------------------------------------------


def test_text_answer_with_the_sdk(sdk: anthropic.Anthropic, control: EngineControl, tokenizer: Tokenizer) -> None:
    control.script({"text": "Hello there, friend."})
    message = sdk.messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert message.id.startswith("msg_")
    assert message.model == MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello there, friend."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    output = len(tokenizer.encode("Hello there, friend.")) + 1  # + eos
    sent = control.received()[-1]
    assert message.usage.input_tokens == len(sent["tokenized"]["input_ids"])
    assert message.usage.output_tokens == output
    assert message.usage.cache_creation_input_tokens == 0 and message.usage.cache_read_input_tokens == 0
    assert prompt_text(control, tokenizer).endswith("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")


def test_engine_request_carries_the_spec_sampling_defaults(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "ok"})
    http.post("/v1/messages", json={"model": MODEL, "max_tokens": 7, "messages": USER}).raise_for_status()
    params = control.received()[-1]["sampling_params"]
    assert params["max_new_tokens"] == 7
    assert params.get("temperature", 0) == 1.0 and params.get("top_p", 0) == 1.0
    assert params["top_k"] == -1
    assert params["skip_special_tokens"] is True
    assert "stop" not in params  # SGLang never gets stop strings


def test_request_sampling_values_reach_the_engine(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "ok"})
    body = {"model": MODEL, "max_tokens": 9, "messages": USER, "temperature": 0.25, "top_p": 0.5, "top_k": 7}
    http.post("/v1/messages", json=body).raise_for_status()
    params = control.received()[-1]["sampling_params"]
    assert params["temperature"] == 0.25 and params["top_p"] == 0.5 and params["top_k"] == 7


@pytest.mark.parametrize(
    "system",
    [
        "You are terse.",
        [{"type": "text", "text": "You are"}, {"type": "text", "text": "terse."}],
    ],
    ids=["string", "blocks"],
)
def test_system_forms_are_rendered(
    http: httpx.Client, control: EngineControl, tokenizer: Tokenizer, system: Any
) -> None:
    control.script({"text": "ok"})
    body = {"model": MODEL, "max_tokens": 8, "messages": USER, "system": system}
    http.post("/v1/messages", json=body).raise_for_status()
    expected = system if isinstance(system, str) else "You are\nterse."
    assert prompt_text(control, tokenizer).startswith(f"<|im_start|>system\n{expected}<|im_end|>\n")


def test_mid_conversation_system_message_is_rendered_in_place(
    http: httpx.Client, control: EngineControl, tokenizer: Tokenizer
) -> None:
    control.script({"text": "ok"})
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "system", "content": "Now answer in French."},
        {"role": "user", "content": "second"},
    ]
    http.post("/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": messages}).raise_for_status()
    text = prompt_text(control, tokenizer)
    assert text.index("reply") < text.index("Now answer in French.") < text.index("second")


def test_alias_is_answered_with_the_canonical_model(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "ok"})
    reply = http.post("/v1/messages", json={"model": "qwen-alias", "max_tokens": 8, "messages": USER})
    assert reply.status_code == 200 and reply.json()["model"] == MODEL


# --- streaming --------------------------------------------------------------------------


def test_streaming_sequence_is_exactly_the_spec_shape(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "There is no single answer", "chunk_size": 100})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True}
    reply = http.post("/v1/messages", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert reply.headers["cache-control"] == "no-cache"
    events = sse_events(reply.text)
    message_id = events[0][1]["message"]["id"]
    sent = control.received()[-1]
    prompt = len(sent["tokenized"]["input_ids"])
    output = events[-2][1]["usage"]["output_tokens"]
    template = (
        "event: message_start\n"
        'data: {"type":"message_start","message":{"id":"ID","type":"message","role":"assistant","content":[],'
        '"model":"MODEL","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0,'
        '"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}\n\n'
        "event: content_block_start\n"
        'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
        "event: content_block_delta\n"
        'data: {"type":"content_block_delta","index":0,'
        '"delta":{"type":"text_delta","text":"There is no single answer"}}\n\n'
        "event: content_block_stop\n"
        'data: {"type":"content_block_stop","index":0}\n\n'
        "event: message_delta\n"
        'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":OUT,'
        '"input_tokens":PROMPT,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}\n\n'
        "event: message_stop\n"
        'data: {"type":"message_stop"}\n\n'
    )
    expected = (
        template.replace('"ID"', f'"{message_id}"')
        .replace('"MODEL"', f'"{MODEL}"')
        .replace(":OUT,", f":{output},")
        .replace(":PROMPT,", f":{prompt},")
    )
    assert reply.text == expected
    assert "[DONE]" not in reply.text


def test_stream_helper_builds_the_same_message_as_the_plain_call(
    sdk: anthropic.Anthropic, control: EngineControl
) -> None:
    text = "Streaming, one token at a time: ünïcödé ✓ 你好 🎉!"
    control.script({"text": text}, {"text": text})
    plain = sdk.messages.create(model=MODEL, max_tokens=128, messages=USER)
    with sdk.messages.stream(model=MODEL, max_tokens=128, messages=USER) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text == plain.content[0].text == final.content[0].text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.usage.input_tokens == plain.usage.input_tokens
    assert final.stop_reason == plain.stop_reason == "end_turn"


def test_multibyte_characters_split_across_tokens_are_never_broken(
    http: httpx.Client, control: EngineControl, tokenizer: Tokenizer
) -> None:
    text = "🎉🎉 naïve 你好吗 😀"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split()), "the fixture must split these characters over several tokens"
    control.script({"token_ids": ids, "chunk_size": 1})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True}
    events = sse_events(http.post("/v1/messages", json=body).text)
    deltas = [e["delta"]["text"] for kind, e in events if kind == "content_block_delta"]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


# --- stops and limits --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_split_across_tokens_is_matched_and_hidden(
    http: httpx.Client, control: EngineControl, tokenizer: Tokenizer, stream: bool
) -> None:
    control.script({"text": "Counting: one two THE END three four", "chunk_size": 1})
    stop = "THE END"
    assert tokenizer.token_id(stop) is None, "a multi-token stop: only the gateway can match it"
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stop_sequences": [stop], "stream": stream}
    reply = http.post("/v1/messages", json=body)
    if stream:
        events = sse_events(reply.text)
        text = "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta")
        delta = next(e for k, e in events if k == "message_delta")["delta"]
    else:
        payload = reply.json()
        text = payload["content"][0]["text"]
        delta = payload
    assert text == "Counting: one two "
    assert delta["stop_reason"] == "stop_sequence" and delta["stop_sequence"] == stop
    assert control.received()[-1]["sampling_params"].get("stop_token_ids", []) == []


def test_single_token_stop_is_sent_as_a_stop_id_and_reported_as_the_string(
    http: httpx.Client, control: EngineControl, tokenizer: Tokenizer
) -> None:
    stop = "</tool_call>"  # one added token in the Qwen3 family
    stop_id = tokenizer.token_id(stop)
    assert stop_id is not None
    control.script({"text": "before</tool_call>after", "chunk_size": 1})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stop_sequences": [stop]}
    payload = http.post("/v1/messages", json=body).json()
    assert control.received()[-1]["sampling_params"]["stop_token_ids"] == [stop_id]
    assert payload["content"][0]["text"] == "before"
    assert payload["stop_reason"] == "stop_sequence" and payload["stop_sequence"] == stop


def test_usage_counts_the_tokens_before_a_stop_matched_in_the_final_message(
    http: httpx.Client, control: EngineControl
) -> None:
    control.script({"text": "Hello there, friend. More", "chunk_size": 100})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stop_sequences": ["friend"]}
    payload = http.post("/v1/messages", json=body).json()
    assert payload["stop_reason"] == "stop_sequence" and payload["content"][0]["text"] == "Hello there, "
    assert payload["usage"]["output_tokens"] > 0


def test_max_tokens_limit_reports_max_tokens(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "one two three four five six seven eight nine ten", "eos": False})
    payload = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 3, "messages": USER}).json()
    assert payload["stop_reason"] == "max_tokens" and payload["stop_sequence"] is None
    assert payload["usage"]["output_tokens"] == 3


def test_eos_is_end_turn_not_a_stop_sequence(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "done"})
    payload = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": USER}).json()
    assert payload["stop_reason"] == "end_turn" and payload["stop_sequence"] is None
    assert payload["content"] == [{"type": "text", "text": "done"}]


def test_whitespace_only_answer_has_no_text_block(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "\n\n"})
    payload = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": USER}).json()
    assert payload["content"] == []


# --- max_tokens 0 and count_tokens ------------------------------------------------------


def test_max_tokens_zero_is_answered_without_the_engine(http: httpx.Client, control: EngineControl) -> None:
    counted = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER}).json()["input_tokens"]
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 0, "messages": USER})
    assert reply.status_code == 200
    payload = reply.json()
    assert payload["content"] == [] and payload["stop_reason"] == "max_tokens" and payload["stop_sequence"] is None
    assert payload["usage"] == {
        "input_tokens": counted,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert payload["id"].startswith("msg_") and payload["model"] == MODEL
    assert control.received() == []


def test_max_tokens_zero_stream_is_three_events(http: httpx.Client, control: EngineControl) -> None:
    counted = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER}).json()["input_tokens"]
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 0, "messages": USER, "stream": True})
    events = sse_events(reply.text)
    assert [k for k, _ in events] == ["message_start", "message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == counted
    assert events[1][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens"},
        "usage": {
            "output_tokens": 0,
            "input_tokens": counted,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert control.received() == []


def test_count_tokens_equals_the_usage_of_a_real_request(sdk: anthropic.Anthropic, control: EngineControl) -> None:
    tools = [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny"}]},
    ]
    counted = sdk.messages.count_tokens(model=MODEL, messages=messages, system="Be brief.", tools=tools)
    control.script({"text": "It is 18C and sunny."})
    message = sdk.messages.create(model=MODEL, max_tokens=32, messages=messages, system="Be brief.", tools=tools)
    assert counted.input_tokens == message.usage.input_tokens
    assert counted.input_tokens == len(control.received()[-1]["tokenized"]["input_ids"])


def test_count_tokens_counts_an_image_as_its_placeholder(http: httpx.Client) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with_image = [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]
    without = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}]
    a = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": with_image}).json()["input_tokens"]
    b = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": without}).json()["input_tokens"]
    assert a > b


def test_document_without_text_is_refused(http: httpx.Client) -> None:
    doc = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
    messages = [{"role": "user", "content": [doc, {"type": "text", "text": "Summarize"}]}]
    reply = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": messages})
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_document_with_text_counts_as_its_text(http: httpx.Client) -> None:
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "alpha beta gamma"}}
    with_doc = [{"role": "user", "content": [doc, {"type": "text", "text": "Summarize"}]}]
    plain = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "alpha beta gamma"}, {"type": "text", "text": "Summarize"}],
        }
    ]
    a = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": with_doc}).json()["input_tokens"]
    b = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": plain}).json()["input_tokens"]
    assert a == b


def test_unknown_model_is_404(http: httpx.Client) -> None:
    for path in ("/v1/messages/count_tokens", "/v1/messages"):
        reply = http.post(path, json={"model": "nope", "max_tokens": 4, "messages": USER})
        assert reply.status_code == 404
        assert reply.headers["x-smg-error-code"] == "model_not_found"


def test_output_format_is_refused_on_grpc(http: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": USER, "output_config": {"format": {"type": "json_schema"}}}
    reply = http.post("/v1/messages", json=body)
    assert reply.status_code == 400 and reply.headers["x-smg-error-code"] == "unsupported_response_format"


# --- engine errors and disconnects -------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_engine_refusal_before_any_output_is_an_error_response(
    http: httpx.Client, control: EngineControl, stream: bool
) -> None:
    control.script({"error": {"code": "INVALID_ARGUMENT", "message": "prompt too long", "after_tokens": 0}})
    body = {"model": MODEL, "max_tokens": 8, "messages": USER, "stream": stream}
    reply = http.post("/v1/messages", json=body)
    assert reply.status_code == 400
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.headers["x-smg-error-code"] == "engine_rejected_request"
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "prompt too long" in reply.json()["error"]["message"]
    assert control.aborts() == []  # the engine already dropped it


def test_engine_error_after_the_first_token_ends_the_stream_with_an_error_event(
    http: httpx.Client, control: EngineControl
) -> None:
    control.script(
        {"text": "partial answer that breaks", "error": {"code": "INTERNAL", "message": "oom", "after_tokens": 2}}
    )
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 32, "messages": USER, "stream": True})
    assert reply.status_code == 200
    events = sse_events(reply.text)
    assert events[0][0] == "message_start"
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "Stream error: oom"}})
    assert "message_stop" not in [k for k, _ in events]


def test_engine_error_mid_generation_without_stream_is_an_envelope(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "partial answer", "error": {"code": "INTERNAL", "message": "oom", "after_tokens": 2}})
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 32, "messages": USER})
    assert reply.status_code == 500
    assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == "api_error"


ADDRESSED = "failed to connect to 127.0.0.1:50051 via ipv4:10.1.2.3:7000 (grpc://engine-0.internal:30001)"


@pytest.mark.parametrize("after_tokens", [0, 2])
def test_an_engine_error_tells_the_client_no_worker_address(
    http: httpx.Client, control: EngineControl, grpc_journal: Path, after_tokens: int
) -> None:
    control.script(
        {"text": "partial answer", "error": {"code": "INTERNAL", "message": ADDRESSED, "after_tokens": after_tokens}}
    )
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 32, "messages": USER, "stream": True})
    said = reply.text if after_tokens else reply.json()["error"]["message"]
    assert "connect to" in said  # the engine's words stay
    for address in ("127.0.0.1", "50051", "10.1.2.3", "engine-0.internal", "30001"):
        assert address not in said, said
    errors = [e for e in wait_for_events(grpc_journal, reply.headers["x-request-id"]) if isinstance(e, Error)]
    assert errors and errors[-1].detail is not None and "127.0.0.1:50051" in errors[-1].detail  # for operators
    assert "127.0.0.1" not in errors[-1].message


def test_client_disconnect_aborts_the_engine_request(grpc_gateway: Spawned, control: EngineControl) -> None:
    control.script({"text": "a long answer that the client will not wait for", "hold_after": 2})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True}
    with httpx.Client(base_url=grpc_gateway.url, timeout=10.0) as client:
        with client.stream("POST", "/v1/messages", json=body) as reply:
            for line in reply.iter_lines():
                if line.startswith("event: content_block_delta"):
                    break
    request_id = control.received()[-1]["request_id"]
    deadline = time.monotonic() + 10
    while request_id not in control.aborts():
        assert time.monotonic() < deadline, "the engine never saw the Abort"
        time.sleep(0.05)
    control.release()


@pytest.mark.parametrize("cut", ["client-gone", "engine-failed"])
def test_a_cut_stream_records_the_rendered_prompts_tokens(
    grpc_gateway: Spawned, control: EngineControl, grpc_journal: Path, cut: str
) -> None:
    if cut == "client-gone":
        control.script({"text": "a long answer that the client will not wait for", "hold_after": 2})
    else:
        control.script(
            {"text": "partial answer that breaks", "error": {"code": "INTERNAL", "message": "oom", "after_tokens": 2}}
        )
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True}
    with httpx.Client(base_url=grpc_gateway.url, timeout=10.0) as client:
        with client.stream("POST", "/v1/messages", json=body) as reply:
            request_id = reply.headers["x-request-id"]
            for line in reply.iter_lines():
                if line.startswith("event: content_block_delta"):
                    break
    events = wait_for_events(grpc_journal, request_id)
    control.release()
    [rendered] = [e for e in events if isinstance(e, Rendered)]
    completed = events[-1]
    assert isinstance(completed, Completed) and completed.usage is not None
    assert rendered.prompt_tokens > 0 and completed.usage["input_tokens"] == rendered.prompt_tokens
    with JournalReader(grpc_journal) as reader:
        row = reader.get_request(request_id)
    assert row is not None and row["input_tokens"] == rendered.prompt_tokens


# --- the journal -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_journal_has_rendered_and_tokens_and_rebuilds_the_response(
    http: httpx.Client, control: EngineControl, grpc_journal: Any, stream: bool
) -> None:
    control.script({"text": "Journaled answer.", "chunk_size": 2})
    body = {"model": MODEL, "max_tokens": 32, "messages": USER, "stream": stream}
    reply = http.post("/v1/messages", json=body)
    events = wait_for_events(grpc_journal, reply.headers["x-request-id"])
    kinds = [e.kind for e in events]
    assert kinds[:4] == ["received", "validated", "routed", "rendered"]
    assert kinds[-1] == "completed"
    rendered = next(e for e in events if isinstance(e, Rendered))
    sent = control.received()[-1]
    assert rendered.prompt_tokens == len(sent["tokenized"]["input_ids"])
    assert rendered.settings and rendered.settings["message_id"].startswith("msg_")
    tokens = [e for e in events if isinstance(e, Tokens)]
    assert tokens and tokens[-1].finish_reason == "stop"
    rebuilt = reconstruct(events)
    assert rebuilt.status == 200 and rebuilt.body == reply.content
