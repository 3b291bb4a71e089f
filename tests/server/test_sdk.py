"""The official `anthropic` SDK as the client: create, stream, count_tokens, errors."""

from __future__ import annotations

import anthropic
import pytest

from tests.conftest import MODEL, Scripted
from tools.spawn import Spawned

MESSAGES = [{"role": "user", "content": "hello sdk"}]


@pytest.fixture
def sdk(gateway: Spawned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-client", base_url=gateway.url, max_retries=0)


def test_create(sdk: anthropic.Anthropic, scripted: Scripted) -> None:
    message = sdk.messages.create(model=MODEL, max_tokens=32, messages=MESSAGES, system="be brief")
    assert message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text == "echo: hello sdk"
    assert message.stop_reason == "end_turn"
    assert isinstance(message.usage.input_tokens, int)
    sent = scripted.received()[-1]
    assert sent["headers"]["anthropic-version"]
    assert "x-api-key" not in sent["headers"]


def test_stream_helper_builds_the_final_message(sdk: anthropic.Anthropic, scripted: Scripted) -> None:
    with sdk.messages.stream(model=MODEL, max_tokens=32, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "echo: hello sdk"
    assert final.content[0].text == "echo: hello sdk"
    assert final.stop_reason == "end_turn"


def test_count_tokens(sdk: anthropic.Anthropic, scripted: Scripted) -> None:
    scripted.script({"json": {"input_tokens": 11}}, path="/v1/messages/count_tokens")
    counted = sdk.messages.count_tokens(model=MODEL, messages=MESSAGES)
    assert counted.input_tokens == 11


def test_validation_refusal_raises_bad_request(sdk: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk.messages.create(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": ""}])
    assert info.value.status_code == 400
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.request_id == info.value.response.headers["x-request-id"]


def test_unknown_model_raises_not_found(sdk: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        sdk.messages.create(model="missing-model", max_tokens=8, messages=MESSAGES)


def test_upstream_overload_raises_the_sdk_error_type(sdk: anthropic.Anthropic, scripted: Scripted) -> None:
    scripted.script(
        {"status": 529, "json": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}}
    )
    with pytest.raises(anthropic.APIStatusError) as info:
        sdk.messages.create(model=MODEL, max_tokens=8, messages=MESSAGES)
    assert info.value.status_code == 529
    assert info.value.body["error"]["type"] == "overloaded_error"
