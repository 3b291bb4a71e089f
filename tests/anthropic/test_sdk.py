"""The official `anthropic` SDK in front of `--backend anthropic`: its key reaches the upstream,
its create, stream and error handling work on what the gateway answers."""

from __future__ import annotations

import anthropic
import pytest

from tests.conftest import Scripted
from tools import anthropic_answers as answers
from tools.spawn import Spawned

MODEL = "claude-sonnet-4-20250514"
MESSAGES = [{"role": "user", "content": "hello sdk"}]


@pytest.fixture
def sdk(anthropic_gateway: Spawned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-sdk", base_url=anthropic_gateway.url, max_retries=0)


def test_create_stream_and_errors(sdk: anthropic.Anthropic, scripted: Scripted) -> None:
    first = answers.message(answers.text("Hello from upstream"), model=MODEL, usage=(4, 3))
    streamed = answers.message(answers.text("streamed reply"), model=MODEL, usage=(4, 2))
    scripted.script(
        answers.json_answer(first),
        answers.sse_answer(streamed, ping=True),
        answers.error_answer(529, "overloaded_error", "Overloaded"),
    )

    message = sdk.messages.create(model=MODEL, max_tokens=32, messages=MESSAGES)
    assert (message.id, message.model, message.stop_reason) == (first["id"], MODEL, "end_turn")
    assert message.content[0].text == "Hello from upstream"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 3)

    with sdk.messages.stream(model=MODEL, max_tokens=32, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed reply" and final.stop_reason == "end_turn"

    with pytest.raises(anthropic.APIStatusError) as info:
        sdk.messages.create(model=MODEL, max_tokens=32, messages=MESSAGES)
    assert info.value.status_code == 529
    assert info.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert info.value.request_id == info.value.response.headers["x-request-id"]

    sent = scripted.received()
    assert len(sent) == 3
    for request in sent:
        headers = request["headers"]
        # The SDK's key, in whichever header this SDK version sends it, and its API version.
        assert "sk-ant-sdk" in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
        assert headers["anthropic-version"]
