"""`tool_choice` against a real vLLM engine with random weights: what the grammar guarantees.

`any` and `tool` reach the engine as a JSON-schema constraint (vLLM's structured outputs,
xgrammar on CPU). Random weights write nothing sensible, but under the grammar every token
keeps the output a prefix of a valid answer, and the engine may stop only where the grammar
accepts one. So: an answer that stopped before `max_tokens` is a whole tool call whose input
fits the schema; one cut by `max_tokens` (random weights like to wander in JSON whitespace)
holds at most calls of the one tool named, their input unfinished; either way the answer is a
real generation (tokens were produced), never the empty success of a request the engine failed. `none`
sends no constraint and no tools, so no tool_use can appear.
"""

from __future__ import annotations

from typing import Any

import anthropic
import jsonschema
from anthropic.types import Message

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CHOICES: dict[str, dict[str, Any]] = {
    "any": {"type": "any"},
    "tool": {"type": "tool", "name": "get_weather"},
    "none": {"type": "none"},
}
MAX_TOKENS = 96


def ask(sdk: anthropic.Anthropic, model: str, choice: str, stream: bool) -> Message:
    """One request with the weather tool and `tool_choice` `choice`, as JSON or streamed."""
    request: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "tools": [WEATHER],
        "tool_choice": CHOICES[choice],
        "messages": [{"role": "user", "content": "What is the weather like in Paris?"}],
        "extra_body": {"temperature": 1.0},
    }
    if stream:
        with sdk.messages.stream(**request) as events:
            return events.get_final_message()
    return sdk.messages.create(**request)


def check_answer(message: Message, choice: str) -> None:
    """What the constraint guarantees of `message` (see the module docstring)."""
    print(choice, message.stop_reason, message.usage.output_tokens, [b.model_dump() for b in message.content])
    assert 0 < message.usage.output_tokens <= MAX_TOKENS, message
    calls = [block for block in message.content if block.type == "tool_use"]
    if choice == "none":
        assert not calls and message.stop_reason in ("end_turn", "max_tokens"), message
        return
    assert message.stop_reason in ("tool_use", "max_tokens"), message
    assert all(call.name == WEATHER["name"] for call in calls), message  # the only name the grammar allows
    if message.usage.output_tokens < MAX_TOKENS:
        # The engine stopped by itself, so the grammar had accepted a whole answer.
        assert message.stop_reason == "tool_use" and calls, message
        for call in calls:
            jsonschema.validate(call.input, WEATHER["input_schema"])
