"""Which reasoning parser a model gets, whether its output starts inside reasoning for a rendered
prompt, and a reasoning stage inside a generation (behaviors.md §F.6, §F.7, §F.8)."""

from __future__ import annotations

from typing import Any

import pytest

from smg.pipeline.generation import Generation, GenerationSettings, Piece, Text, TextStage, Thinking
from smg.pipeline.parsers.reasoning import (
    DETECTION_PATTERNS,
    REASONING_PARSERS,
    detect_reasoning_parser,
    make_reasoning_parser,
    start_in_prompt,
    starts_in_reasoning,
)
from smg.pipeline.render import Prompt, render_prompt
from smg.protocol.fold import BlockFold
from smg.protocol.request import CreateMessageRequest
from tests.pipeline import _toy

Event = dict[str, Any]

# --- detection (§F.7) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "parser"),
    [
        ("Qwen/Qwen3-8B", "qwen3"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen3"),  # every id containing "qwen"
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen3"),  # "qwen3-thinking" is not a substring
        ("qwen3-thinking-local", "qwen3_thinking"),
        ("deepseek-ai/DeepSeek-R1", "deepseek_r1"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deepseek_r1"),  # first match wins over qwen
        ("deepseek-ai/DeepSeek-V3.1", "deepseek_v31"),
        ("deepseek-ai/DeepSeek-V4-Flash", "deepseek_v4"),
        ("deepseek-ai/DeepSeek-V3", None),
        ("zai-org/GLM-4.5-Air", None),  # the pitfall: glm-4.5 is not glm45
        ("glm45-air", "glm45"),
        ("zai-org/GLM-5", "glm45"),
        ("moonshotai/Kimi-K2-Thinking", "kimi_thinking"),
        ("moonshotai/Kimi-K2.5", "kimi_k25"),
        ("moonshotai/Kimi-K2-Instruct", "kimi"),
        ("moonshotai/Kimi-K3", "kimi_k3"),  # matched before "kimi"
        ("moonshotai/Kimi_K3-Preview", "kimi_k3"),
        ("stepfun-ai/step3", "step3"),
        ("MiniMaxAI/MiniMax-M2", "minimax"),
        ("CohereLabs/c4ai-command-a-03-2025", "cohere_cmd"),
        ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "nano_v3"),
        ("inkling-chat", "inkling"),
        ("org/Inkling-7B", "inkling"),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        ("some/unknown-model", None),
    ],
)
def test_detection(model: str, parser: str | None) -> None:
    assert detect_reasoning_parser(model) == parser
    assert detect_reasoning_parser(model.upper()) == parser


def test_every_detected_name_is_registered() -> None:
    names = {name for _, name in DETECTION_PATTERNS}
    assert names <= set(REASONING_PARSERS)
    assert {"passthrough", "base"} <= set(REASONING_PARSERS)


# --- starts_in_reasoning with the fixture templates (§F.6) ----------------------------------------


def prompt(fixture: str, thinking: str | None) -> Prompt:
    body: dict[str, Any] = {"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "Hi"}]}
    if thinking == "enabled":
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    elif thinking is not None:
        body["thinking"] = {"type": thinking}
    return render_prompt(_toy.fixture(fixture), CreateMessageRequest.model_validate(body))


@pytest.mark.parametrize(
    ("fixture", "thinking", "parser", "expected"),
    [
        # Qwen3 thinking on: the generation prompt has no <think>; the model writes it.
        ("qwen3", None, "qwen3", False),
        ("qwen3", "enabled", "qwen3", False),
        ("qwen3", "adaptive", "qwen3", False),
        ("qwen3", "enabled", "qwen3_thinking", True),
        ("qwen3", "enabled", "deepseek_r1", True),
        # Qwen3 thinking off: the template closed reasoning with <think>\n\n</think>\n\n.
        ("qwen3", "disabled", "qwen3", False),
        ("qwen3", "disabled", "qwen3_thinking", False),
        ("qwen3", "disabled", "deepseek_r1", False),
        # DeepSeek V3.1: <think> prefilled when thinking is on, </think> otherwise.
        ("deepseek", "enabled", "deepseek_v31", True),
        ("deepseek", "adaptive", "deepseek_v31", True),
        ("deepseek", None, "deepseek_v31", False),
        ("deepseek", "disabled", "deepseek_v31", False),
        ("deepseek", "disabled", "deepseek_r1", False),
        ("deepseek", None, "deepseek_r1", False),
        ("deepseek", "enabled", "passthrough", False),
    ],
)
def test_starts_in_reasoning_with_fixture_templates(
    fixture: str, thinking: str | None, parser: str, expected: bool
) -> None:
    p = prompt(fixture, thinking)
    assert starts_in_reasoning(parser, p.thinking, p.text) is expected


def test_what_the_fixture_templates_render() -> None:
    assert prompt("qwen3", "disabled").text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt("qwen3", "enabled").text.endswith("<|im_start|>assistant\n")
    assert prompt("deepseek", "enabled").text.endswith("<｜Assistant｜><think>")
    assert prompt("deepseek", "disabled").text.endswith("<｜Assistant｜></think>")


def test_starts_in_reasoning_rules() -> None:
    # A start marker at the end of the prompt, maybe followed by whitespace, opens reasoning.
    assert starts_in_reasoning("qwen3", True, "<|im_start|>assistant\n<think>\n")
    assert starts_in_reasoning("qwen3", None, "<|im_start|>assistant\n<think>\n")
    assert starts_in_reasoning("kimi", None, "assistant◁think▷")
    assert starts_in_reasoning("cohere_cmd", None, "<|START_THINKING|>\n")
    # Otherwise the parser's default ...
    assert not starts_in_reasoning("qwen3", True, "<|im_start|>assistant\n")
    assert starts_in_reasoning("deepseek_r1", True, "<｜Assistant｜>")
    assert starts_in_reasoning("deepseek_r1", None, "<｜Assistant｜>")
    # ... unless thinking is off for the render, or the prompt closed reasoning.
    assert not starts_in_reasoning("deepseek_r1", False, "<｜Assistant｜>")
    assert not starts_in_reasoning("minimax", True, "<think>\n\n</think>\n\n")
    assert not starts_in_reasoning("passthrough", True, "<think>")
    with pytest.raises(ValueError):
        starts_in_reasoning("nope", True, "")


def test_start_in_prompt() -> None:
    assert start_in_prompt("deepseek_v31", prompt("deepseek", "enabled").text)
    assert not start_in_prompt("deepseek_v31", prompt("deepseek", "disabled").text)
    assert not start_in_prompt("qwen3", prompt("qwen3", "enabled").text)
    assert not start_in_prompt("qwen3", prompt("qwen3", "disabled").text)


def stage_for(name: str, p: Prompt) -> TextStage:
    in_reasoning = starts_in_reasoning(name, p.thinking, p.text)
    return make_reasoning_parser(name, in_reasoning, start_consumed=start_in_prompt(name, p.text))


def feed_all(stage: TextStage, text: str) -> list[Piece]:
    out: list[Piece] = []
    for ch in text:
        out += stage.feed([Text(ch)])
    return out + stage.flush()


def test_stage_for_a_qwen3_prompt_with_thinking_on() -> None:
    p = prompt("qwen3", "enabled")
    stage = stage_for("qwen3", p)
    out = feed_all(stage, "<think>\nplan\n</think>\n\nAnswer <think>.")
    assert "".join(x.text for x in out if isinstance(x, Thinking)) == "\nplan\n"
    assert "".join(x.text for x in out if isinstance(x, Text)) == "Answer <think>."


def test_stage_for_a_deepseek_prompt_that_prefilled_think() -> None:
    p = prompt("deepseek", "enabled")
    stage = stage_for("deepseek_v31", p)
    out = feed_all(stage, "plan</think>Answer. <think>x</think>")
    assert "".join(x.text for x in out if isinstance(x, Thinking)) == "plan"
    # The start marker was consumed by the prompt: a later one is literal, as in the reference.
    assert "".join(x.text for x in out if isinstance(x, Text)) == "Answer. <think>x</think>"


# --- end to end through a Generation --------------------------------------------------------------


def generate(stage: TextStage, output: str, stream: bool = True, **kw: Any) -> list[Event]:
    tokenizer = _toy.fixture("qwen3")
    settings = GenerationSettings(
        message_id="msg_r", model="qwen", stream=stream, eos_token_ids=tokenizer.eos_token_ids, **kw
    )
    gen = Generation(tokenizer, settings, stages=[stage])
    ids = tokenizer.encode(output)
    events = gen.start()
    for token in ids:
        events += gen.feed([token])
    return events + gen.finish("stop", 9, len(ids))


def fold(events: list[Event]) -> list[dict[str, Any]]:
    folder = BlockFold()
    for event in events:
        folder.feed(event)
    return folder.content()


@pytest.mark.parametrize("stream", [True, False])
def test_thinking_then_text_blocks_from_engine_tokens(stream: bool) -> None:
    tokenizer = _toy.fixture("qwen3")
    ids = tokenizer.encode("<think>plan</think>\n\nAnswer.")
    assert tokenizer.token_id("<think>") in ids and tokenizer.token_id("</think>") in ids
    events = generate(make_reasoning_parser("qwen3", False), "<think>plan</think>\n\nAnswer.", stream)
    assert [e["type"] for e in events if e["type"] != "content_block_delta"] == [
        "message_start",
        "content_block_start",
        "content_block_stop",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
    }
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    thinking = [d["thinking"] for d in deltas if d["type"] == "thinking_delta"]
    text = [d["text"] for d in deltas if d["type"] == "text_delta"]
    # No marker in any delta, the first one included.
    assert "".join(thinking) == "plan" and all("think>" not in t for t in thinking + text)
    assert "".join(text) == "Answer."
    assert fold(events) == [
        {"type": "thinking", "thinking": "plan", "signature": ""},
        {"type": "text", "text": "Answer."},
    ]
    assert events[-2]["delta"] == {"stop_reason": "end_turn"}


def test_unterminated_reasoning_ends_as_a_thinking_block() -> None:
    events = generate(make_reasoning_parser("qwen3", True), "still thinking </thi")
    assert fold(events) == [{"type": "thinking", "thinking": "still thinking </thi", "signature": ""}]


@pytest.mark.parametrize("stream", [True, False])
def test_display_omitted_keeps_an_empty_thinking_block(stream: bool) -> None:
    # The parser emits the thinking as always; the block builder keeps the block, not its text.
    stage = make_reasoning_parser("qwen3", False)
    events = generate(stage, "<think>plan</think>\n\nAnswer.", stream, display_omitted=True)
    assert not [e for e in events if e.get("delta", {}).get("type") == "thinking_delta"]
    assert fold(events) == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": "Answer."},
    ]
