"""The pure prepare step: from a validated request and its tokenizer to what every engine call
of one generation shares, with no I/O and no connector state.

The connector (gRPC, ZMQ, PD, EPD) does the waiting — for the tokenizer, for a long render on a
thread, for an image fetch — and hands the results here: the window a prompt is refused
against before a worker is chosen, the answers the gateway gives itself (count_tokens,
`max_tokens: 0`), and `prepare`, which plans the output (parsers, constraint, single-token
stops) and builds the generation settings the journal records. Everything an engine call is
built from is in the returned `Prepared`; the engine-specific call is the connector's.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from journal.events import Block, Counted, Event, Rendered, Routed
from smg.pipeline.generation import GenerationSettings, empty_message
from smg.pipeline.output import OutputPlan, apply_plan, plan_output
from smg.pipeline.render import Prompt
from smg.pipeline.render.bound import context_exceeded, prompt_token_floor
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.pipeline.vision import VisionItem

# Bodies up to this size render inline (and skip the untokenized bound): a thread hop costs
# more than rendering them.
RENDER_INLINE_BYTES = 16_384


@dataclass
class Prepared:
    """What every attempt of one generation shares: the request, its rendered prompt (image
    placeholders expanded in `prompt.ids`), the output plan and the generation settings.
    `image_data`: the images' own bytes, kept only for a pool with an engine that takes them."""

    request: Any  # the validated CreateMessageRequest
    model: str
    stream: bool
    tokenizer: Tokenizer
    prompt: Prompt
    message_id: str
    source: str | None  # where the tokenizer came from, as the journal records it
    settings: GenerationSettings
    plan: OutputPlan
    stop_ids: dict[int, str]
    images: list[VisionItem] = field(default_factory=list)
    image_data: list[bytes] = field(default_factory=list)


def stop_token_map(tokenizer: Tokenizer, stops: list[str]) -> dict[int, str]:
    """Each stop sequence that encodes to exactly one token, by that token id."""
    out: dict[int, str] = {}
    for stop in stops:
        token = tokenizer.token_id(stop)
        if token is not None:
            out.setdefault(token, stop)
    return out


def settings_record(settings: GenerationSettings) -> dict[str, Any]:
    """The settings as the journal keeps them (JSON object keys are strings): the fields in
    their declared order, what they hold copied (the record outlives later edits of them).
    Written out rather than `dataclasses.asdict`, which walks every value at
    about 25 times the cost."""
    s = settings
    return {
        "message_id": s.message_id,
        "model": s.model,
        "stream": s.stream,
        "stop_sequences": list(s.stop_sequences),
        "stop_token_map": {str(k): v for k, v in s.stop_token_map.items()},
        "eos_token_ids": list(s.eos_token_ids),
        "skip_special_tokens": s.skip_special_tokens,
        "tool_parser": s.tool_parser,
        "reasoning_parser": s.reasoning_parser,
        "in_reasoning": s.in_reasoning,
        "start_consumed": s.start_consumed,
        "forced_tool": s.forced_tool,
        "tools": copy.deepcopy(s.tools) if s.tools is not None else None,
        "display_omitted": s.display_omitted,
    }


def refusal_window(windows: Sequence[int], *, endpoint: str, generating: bool) -> int | None:
    """The window a prompt must certainly exceed to be refused before a worker is chosen: a
    generation's worker is chosen later (the largest window may take it), `max_tokens: 0`
    answers within the smallest; count_tokens counts whatever the length."""
    if not windows or endpoint != "messages":
        return None
    return max(windows) if generating else min(windows)


def check_untokenized(tokenizer: Tokenizer, request: Any, within: int | None, body_bytes: int) -> None:
    """A long body is refused before rendering when its user text alone cannot fit, whatever
    the template does. Raises `ApiError`."""
    if within is None or body_bytes <= RENDER_INLINE_BYTES:
        return
    floor = prompt_token_floor(tokenizer, request)
    if floor > within:
        raise context_exceeded(within, floor, at_least=True)


def count_answer(backend: str, model: str, prompt: Prompt, source: str | None) -> list[Event]:
    """count_tokens, answered by the gateway itself: no worker takes part."""
    return [
        Routed(backend=backend, worker=None, model=model, policy=None),
        Rendered(prompt_tokens=len(prompt.ids), prompt_digest=prompt.digest, tokenizer=source),
        Counted(input_tokens=len(prompt.ids)),
    ]


def empty_answer(
    backend: str,
    model: str,
    stream: bool,
    prompt: Prompt,
    source: str | None,
    message_id: str,
    windows: Sequence[int],
) -> list[Event]:
    """`max_tokens: 0`, answered by the gateway within the pool's smallest window. Raises `ApiError`."""
    if windows and len(prompt.ids) > min(windows):
        raise context_exceeded(min(windows), len(prompt.ids))
    settings = GenerationSettings(message_id=message_id, model=model, stream=stream)
    events: list[Event] = [
        Routed(backend=backend, worker=None, model=model, policy=None),
        Rendered(
            prompt_tokens=len(prompt.ids),
            prompt_digest=prompt.digest,
            tokenizer=source,
            settings=settings_record(settings),
        ),
    ]
    events += [Block(payload) for payload in empty_message(message_id, model, len(prompt.ids))]
    return events


def prepare(
    request: Any,
    model: str,
    stream: bool,
    tokenizer: Tokenizer,
    prompt: Prompt,
    message_id: str,
    source: str | None,
    *,
    tool_parser: str | None,
    reasoning_parser: str | None,
    images: Sequence[VisionItem] = (),
    image_data: Sequence[bytes] = (),
) -> Prepared:
    """The generation's shared part: the output plan, the single-token stops and the settings
    (the engine's EOS ids join them when the session starts)."""
    stops = list(request.stop_sequences or [])
    stop_ids = stop_token_map(tokenizer, stops)
    settings = GenerationSettings(
        message_id=message_id,
        model=model,
        stream=stream,
        stop_sequences=stops,
        stop_token_map=stop_ids,
        eos_token_ids=[],
    )
    plan = plan_output(request, prompt, model, tool_parser=tool_parser, reasoning_parser=reasoning_parser)
    apply_plan(settings, plan, prompt.tools)
    return Prepared(
        request,
        model,
        stream,
        tokenizer,
        prompt,
        message_id,
        source,
        settings,
        plan,
        stop_ids,
        list(images),
        list(image_data),
    )


def check_window(prepared: Prepared, window: int | None) -> None:
    """The prompt fits a worker's context window (when it advertises one). Raises `ApiError`."""
    if window is not None and len(prepared.prompt.ids) > window:
        raise context_exceeded(window, len(prepared.prompt.ids))
