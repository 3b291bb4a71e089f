"""Prompt-conditional scripts: `when_prompt_contains` picks the script by the prompt, `repeat` keeps it.

The rules are runtime-independent (the choice is made before the runtime's semantics apply), so
one runtime shows them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from smg.backends.grpc.engines import connect
from smg.backends.grpc.types import EngineClient, EngineDone, GenerateCall
from tests.engines.conftest import EngineUnderTest


@pytest.fixture
async def client(sglang: EngineUnderTest) -> AsyncIterator[EngineClient]:
    engine_client = connect(sglang.runtime, sglang.url)
    try:
        yield engine_client
    finally:
        await engine_client.close()


def prompt(tokenizer: Any, text: str) -> list[int]:
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


async def first_id(client: EngineClient, tokenizer: Any, text: str, request_id: str) -> int:
    call = GenerateCall(request_id=request_id, input_ids=prompt(tokenizer, text), text=text, stream=False)
    events = [event async for event in client.generate(call)]
    done = events[-1]
    assert isinstance(done, EngineDone), events
    return done.token_ids[0]


async def test_the_first_matching_script_answers_and_the_rest_wait(
    sglang: EngineUnderTest, client: EngineClient, tokenizer: Any
) -> None:
    sglang.control.script(
        {"token_ids": [30], "when_prompt_contains": "<tool_response>"},
        {"token_ids": [31], "when_prompt_contains": "title"},
        {"token_ids": [32]},
        default={"token_ids": [39], "eos": False},
    )
    asked = [
        ("Write a title for this.", 31),  # skips the first rule: it does not match
        ("<|im_start|>user\nHi<|im_end|>", 32),  # the unconditional script matches anything
        ("<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>", 30),  # special tokens kept
        ("<tool_response> again", 39),  # each was used once: the default answers
    ]
    answers = [await first_id(client, tokenizer, text, f"req-{n}") for n, (text, _) in enumerate(asked)]
    assert answers == [want for _, want in asked]


async def test_a_repeating_rule_stays_queued(sglang: EngineUnderTest, client: EngineClient, tokenizer: Any) -> None:
    sglang.control.script(
        {"token_ids": [40], "when_prompt_contains": "side request", "repeat": True},
        {"token_ids": [41]},
        {"token_ids": [42]},
        default={"token_ids": [49], "eos": False},
    )
    texts = ["a side request", "the main loop", "another side request", "the main loop", "the main loop"]
    answers = [await first_id(client, tokenizer, text, f"req-{n}") for n, text in enumerate(texts)]
    assert answers == [40, 41, 40, 42, 49]
    assert len(sglang.control.received()) == len(texts)


async def test_reset_clears_the_rules(sglang: EngineUnderTest, client: EngineClient, tokenizer: Any) -> None:
    sglang.control.script({"token_ids": [50], "repeat": True}, default={"token_ids": [59], "eos": False})
    assert await first_id(client, tokenizer, "one", "req-0") == 50
    assert await first_id(client, tokenizer, "two", "req-1") == 50
    sglang.control.reset()
    sglang.control.script(default={"token_ids": [59], "eos": False})
    assert await first_id(client, tokenizer, "three", "req-2") == 59


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({"when_prompt_contains": 3}, "when_prompt_contains must be a non-empty string"),
        ({"when_prompt_contains": ""}, "when_prompt_contains must be a non-empty string"),
        ({"repeat": "yes"}, "repeat must be a boolean"),
    ],
)
def test_bad_rules_are_refused(sglang: EngineUnderTest, script: dict[str, Any], message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        sglang.control.script(script)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in str(caught.value.details())
