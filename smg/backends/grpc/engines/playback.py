"""A playback engine: an `EngineClient` with no process and no socket, answering as a test says.

It is handed to `EngineConnector` through its `clients=` seam (a `Playbook`), as httpx's
`MockTransport` is handed to a client: everything above the engine client — discovery, the
tokenizer, the prompt, the generation session, the attempt loop and its error mapping, the
router, the app — runs as it does live. Each `generate` plays the next queued answer:

- a `Script` (the one script format, parsed here; the scripted gRPC and ZMQ engines of
  `tools/` read it with this parser and add their `delay_ms`: `text` or
  `token_ids`, `eos`, `chunk_size`, `finish_reason`, `matched_stop`, `prompt_tokens`,
  `cached_tokens`, `hold_after`, `error`, `exit_after`, `when_prompt_contains`, `repeat`),
  played with one engine's neutral semantics: chunks of new ids with running totals, a stop at
  the call's `max_tokens` ("length"), at a stop or EOS id ("stop", that id matched) or, for the
  stop strings an engine is given, at one in the decoded text; `delay_ms` is not accepted:
  a test waits on events (`hold_after` holds the stream until `release()`, `held` says it holds);
- a `Recording`: a journaled request's engine output (its `tokens` events) played back as it was.

What the engine was asked is kept for the test: every `GenerateCall` (`received`), the ids
named by `abort` (`aborts`) and the streams the caller left before their end (`cancelled`).
Discovery, health and loads answer from its attributes (`info`, `healthy`, `load`); its
tokenizer bundle is `bundle`, held until `release()` while `hold_bundle` is set.
`exit_after` ends the engine as a crash does: the stream fails `UNAVAILABLE` and every later
call too, until `revive()`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import grpc

from journal.events import Event, Tokens
from smg.backends.base import Target, WorkerUnreachable
from smg.backends.grpc.types import (
    EngineChunk,
    EngineClient,
    EngineDone,
    EngineError,
    EngineEvent,
    EngineInfo,
    EngineLoad,
    GenerateCall,
)
from smg.pipeline.tokenizers.tokenizer import Tokenizer

DEFAULT_TEXT = "Hello! I am the scripted engine, answering over gRPC."
SCRIPT_KEYS = frozenset(
    (
        "text",
        "token_ids",
        "eos",
        "chunk_size",
        "finish_reason",
        "matched_stop",
        "prompt_tokens",
        "cached_tokens",
        "hold_after",
        "error",
        "exit_after",
        "when_prompt_contains",
        "repeat",
    )
)
"""The keys of the script format; the scripted engines add theirs (`delay_ms`)."""


@dataclass(frozen=True)
class ScriptedFailure:
    """The status a script ends its stream with, once `after_tokens` tokens were generated.
    `code` is a gRPC status name other than OK (e.g. `INVALID_ARGUMENT`)."""

    code: str
    message: str
    after_tokens: int = 0


@dataclass(frozen=True)
class Script:
    """One answer, decided against the call it answers (see the module docstring)."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    eos: bool = True
    chunk_size: int = 1
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    hold_after: int | None = None
    error: ScriptedFailure | None = None
    exit_after: int | None = None
    when_prompt_contains: str | None = None
    repeat: bool = False

    @classmethod
    def parse(cls, raw: Any, *, extra_keys: frozenset[str] = frozenset()) -> Self:
        """A script in its JSON form. Raises `ValueError` saying what is wrong. `extra_keys` are
        left to the caller (a scripted engine's own keys), neither refused nor read."""
        if not isinstance(raw, Mapping):
            raise ValueError("a script must be a JSON object")
        unknown = set(raw) - SCRIPT_KEYS - extra_keys
        if unknown:
            raise ValueError(f"unknown script keys: {', '.join(sorted(unknown))}")
        text = raw.get("text")
        if text is not None and not isinstance(text, str):
            raise ValueError("text must be a string")
        token_ids = raw.get("token_ids")
        if token_ids is not None:
            if not isinstance(token_ids, list) or not all(_is_count(t) for t in token_ids):
                raise ValueError("token_ids must be a list of non-negative integers")
            if text is not None:
                raise ValueError("give text or token_ids, not both")
        eos = raw.get("eos", True)
        if not isinstance(eos, bool):
            raise ValueError("eos must be a boolean")
        finish_reason = raw.get("finish_reason")
        if finish_reason is not None and not isinstance(finish_reason, str):
            raise ValueError("finish_reason must be a string")
        matched = raw.get("matched_stop")
        if matched is not None and not (isinstance(matched, str) or _is_count(matched)):
            raise ValueError("matched_stop must be a token id or a string")
        when = raw.get("when_prompt_contains")
        if when is not None and (not isinstance(when, str) or not when):
            raise ValueError("when_prompt_contains must be a non-empty string")
        repeat = raw.get("repeat", False)
        if not isinstance(repeat, bool):
            raise ValueError("repeat must be a boolean")
        return cls(
            text=text,
            token_ids=tuple(token_ids) if token_ids is not None else None,
            eos=eos,
            chunk_size=_count(raw, "chunk_size", 1, minimum=1),
            finish_reason=finish_reason,
            matched_stop=matched,
            prompt_tokens=_optional_count(raw, "prompt_tokens"),
            cached_tokens=_count(raw, "cached_tokens", 0),
            hold_after=_optional_count(raw, "hold_after"),
            error=_failure(raw.get("error")),
            exit_after=_optional_count(raw, "exit_after"),
            when_prompt_contains=when,
            repeat=repeat,
        )

    def matches(self, prompt: Callable[[], str]) -> bool:
        return self.when_prompt_contains is None or self.when_prompt_contains in prompt()


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(raw: Mapping[str, Any], key: str, default: int, *, minimum: int = 0) -> int:
    value = raw.get(key, default)
    if not _is_count(value) or value < minimum:
        raise ValueError(f"{key} must be an integer of at least {minimum}")
    return int(value)


def _optional_count(raw: Mapping[str, Any], key: str) -> int | None:
    return _count(raw, key, 0) if raw.get(key) is not None else None


def _failure(raw: Any) -> ScriptedFailure | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError("error must be an object")
    name = raw.get("code", "INTERNAL")
    code = str(name).upper()
    if code not in grpc.StatusCode.__members__:
        raise ValueError(f"error.code {name!r} is not a gRPC status name")
    if code == "OK":
        raise ValueError("error.code cannot be OK")
    message = raw.get("message", "scripted failure")
    if not isinstance(message, str):
        raise ValueError("error.message must be a string")
    return ScriptedFailure(code, message, _count(raw, "after_tokens", 0))


@dataclass(frozen=True)
class Recording:
    """A journaled generation's engine output, played back whatever the call asks: each
    `tokens` event one chunk, the one with a finish reason the end."""

    chunks: tuple[EngineEvent, ...]
    repeat: bool = False
    when_prompt_contains: str | None = None

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> Recording:
        """From a request's journaled events (the last attempt's `tokens`, if it was retried).
        Raises `ValueError` when they hold no finished engine output."""
        chunks: list[EngineEvent] = []
        for event in events:
            if not isinstance(event, Tokens):
                continue
            if chunks and isinstance(chunks[-1], EngineDone):
                chunks = []  # a later attempt's output replaces an earlier one's
            prompt = event.prompt_tokens or 0
            completion = event.completion_tokens or 0
            if event.finish_reason is None:
                chunks.append(EngineChunk(list(event.ids), prompt, completion))
                continue
            matched = event.matched_stop
            chunks.append(
                EngineDone(
                    finish_reason=event.finish_reason,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    token_ids=list(event.ids),
                    matched_token_id=matched if isinstance(matched, int) else None,
                    matched_stop_str=matched if isinstance(matched, str) else None,
                )
            )
        if not chunks or not isinstance(chunks[-1], EngineDone):
            raise ValueError("the events hold no finished engine output (no `tokens` event with a finish reason)")
        return cls(tuple(chunks))

    def matches(self, prompt: Callable[[], str]) -> bool:
        return self.when_prompt_contains is None or self.when_prompt_contains in prompt()


Answer = Script | Recording


@dataclass
class _Hold:
    """The stream waits here for `release()`."""


@dataclass
class _Fail:
    error: EngineError
    crash: bool = False


_Step = EngineEvent | _Hold | _Fail


class PlaybackEngine:
    """One engine, as an `EngineClient`. `tokenizer` encodes `text` scripts and decodes prompts
    for `when_prompt_contains` and output for stop strings; scripts of `token_ids` need none."""

    def __init__(
        self,
        model_id: str,
        *,
        runtime: str = "sglang",
        target: str = "playback",
        tokenizer: Tokenizer | None = None,
        model_path: str = "",
        tokenizer_path: str = "",
        max_context_length: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        default_sampling: Mapping[str, Any] | None = None,
        server_info: Mapping[str, Any] | None = None,
        load: EngineLoad | None = None,
        bundle: bytes | None = None,
    ) -> None:
        self.runtime = runtime
        self.target = target
        self.tokenizer = tokenizer
        eos = list(eos_token_ids) if eos_token_ids is not None else list(tokenizer.eos_token_ids if tokenizer else [])
        self.info = EngineInfo(
            model_id=model_id,
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            max_context_length=max_context_length,
            eos_token_ids=eos,
            default_sampling=dict(default_sampling or {}),
        )
        self._server_info = dict(server_info or {})
        self.load = load  # what `loads` answers (None: the protocol has no GetLoads)
        self._bundle = bundle
        self.hold_bundle = False  # `tokenizer_bundle` answers only after `release()`
        self.healthy = True
        self.down = False  # nothing answers: every call fails UNAVAILABLE (set by `exit_after`)
        self._queue: deque[Answer] = deque()
        self._default: Answer | None = None
        self.received: list[GenerateCall] = []
        self.aborts: list[str] = []
        self.cancelled: list[str] = []
        self.closed = False
        self._release = asyncio.Event()
        self.held = asyncio.Event()  # set while a stream waits at its `hold_after`
        self._holding = 0

    # what the test does

    def script(self, *answers: Answer | Mapping[str, Any], default: Answer | Mapping[str, Any] | None = None) -> None:
        """Queue answers for the next `generate` calls (scripts as JSON-like dicts, `Script`s or
        `Recording`s); `default` answers once they run out (else the default text)."""
        self._queue.extend(_answer(a) for a in answers)
        if default is not None:
            self._default = _answer(default)

    def release(self) -> None:
        """Let the streams waiting at `hold_after` (and a held tokenizer bundle) go on; a later
        one holds again."""
        self._release.set()
        self._release = asyncio.Event()

    def revive(self) -> None:
        """A crashed (or downed) engine answers again."""
        self.down = False

    # EngineClient

    async def health(self) -> bool:
        self._answering()
        return self.healthy

    async def model_info(self) -> EngineInfo:
        self._answering()
        return self.info

    async def server_info(self) -> dict[str, Any]:
        self._answering()
        return dict(self._server_info)

    async def loads(self) -> EngineLoad | None:
        self._answering()
        return self.load

    async def abort(self, request_id: str) -> None:
        self._answering()
        self.aborts.append(request_id)

    async def tokenizer_bundle(self) -> bytes:
        self._answering()
        if self.hold_bundle:
            await self._release.wait()
        if self._bundle is None:
            raise EngineError("UNIMPLEMENTED", "this engine serves no tokenizer bundle")
        return self._bundle

    async def close(self) -> None:
        self.closed = True

    def generate(self, call: GenerateCall) -> AsyncIterator[EngineEvent]:
        return self._generate(call)

    async def _generate(self, call: GenerateCall) -> AsyncIterator[EngineEvent]:
        self._answering()
        self.received.append(call)
        steps = self._steps(self._take(call), call)
        finished = False
        try:
            for step in steps:
                if isinstance(step, _Hold):
                    release = self._release
                    self._holding += 1
                    self.held.set()
                    try:
                        await release.wait()
                    finally:
                        self._holding -= 1
                        if not self._holding:
                            self.held.clear()
                    continue
                if isinstance(step, _Fail):
                    finished = True
                    if step.crash:
                        self.down = True
                    raise step.error
                if isinstance(step, EngineDone):
                    finished = True
                yield step
        finally:
            if not finished:
                self.cancelled.append(call.request_id)

    # internals

    def _answering(self) -> None:
        if self.down:
            raise EngineError("UNAVAILABLE", f"failed to connect to all addresses; last error: {self.target} is down")

    def _take(self, call: GenerateCall) -> Answer:
        prompt: list[str] = []

        def decoded() -> str:
            if not prompt:
                if self.tokenizer is None:
                    raise ValueError("when_prompt_contains needs the engine's tokenizer")
                prompt.append(self.tokenizer.decode(call.input_ids, skip_special_tokens=False))
            return prompt[0]

        for answer in self._queue:
            if answer.matches(decoded):
                if not answer.repeat:
                    self._queue.remove(answer)
                return answer
        return self._default if self._default is not None else Script()

    def _steps(self, answer: Answer, call: GenerateCall) -> list[_Step]:
        if isinstance(answer, Recording):
            return list(answer.chunks)
        return _play(answer, call, self)


def _answer(raw: Answer | Mapping[str, Any]) -> Answer:
    return raw if isinstance(raw, Script | Recording) else Script.parse(raw)


def _play(script: Script, call: GenerateCall, engine: PlaybackEngine) -> list[_Step]:
    """The stream a script makes for a call, as an engine generates it."""
    tokenizer = engine.tokenizer
    if script.token_ids is not None:
        tokens = list(script.token_ids)
    else:
        if tokenizer is None:
            raise ValueError("a text script needs the engine's tokenizer")
        tokens = tokenizer.encode(script.text if script.text is not None else DEFAULT_TEXT)
    eos_ids = engine.info.eos_token_ids
    if script.eos and eos_ids:
        tokens.append(eos_ids[0])
    stop_ids = set(call.stop_token_ids) | set(eos_ids)
    stops = [s for s in call.stop if s]
    generated: list[int] = []
    finish, matched_id, matched_str = "stop", None, None
    limit = call.max_tokens
    if limit is not None and limit <= 0:
        finish, tokens = "length", []
    for token in tokens:
        generated.append(token)
        if limit is not None and len(generated) >= limit:
            finish = "length"
            break
        if token in stop_ids:
            matched_id = token
            break
        if stops and tokenizer is not None:
            text = tokenizer.decode(generated)
            hit = next((s for s in stops if s in text), None)
            if hit is not None:
                matched_str = hit
                break
    if script.finish_reason is not None:
        finish = script.finish_reason
    if isinstance(script.matched_stop, str):
        matched_id, matched_str = None, script.matched_stop
    elif script.matched_stop is not None:
        matched_id, matched_str = int(script.matched_stop), None

    prompt = script.prompt_tokens if script.prompt_tokens is not None else len(call.input_ids)
    cached = script.cached_tokens
    failure: _Fail | None = None
    fail_at: int | None = None
    if script.error is not None:
        failure, fail_at = _Fail(EngineError(script.error.code, script.error.message)), script.error.after_tokens
    if script.exit_after is not None and (fail_at is None or script.exit_after < fail_at):
        crash = EngineError("UNAVAILABLE", "Socket closed")
        failure, fail_at = _Fail(crash, crash=True), script.exit_after

    steps: list[_Step] = []
    sent = 0
    held = script.hold_after is None
    streamed = generated if call.stream else []
    while True:
        if not held and sent >= (script.hold_after or 0):
            steps.append(_Hold())
            held = True
        if failure is not None and fail_at is not None and sent >= fail_at:
            steps.append(failure)
            return steps
        if sent >= len(streamed):
            break
        step = script.chunk_size
        for point in (script.hold_after, fail_at):
            if point is not None and point > sent:
                step = min(step, point - sent)
        ids = streamed[sent : sent + step]
        sent += len(ids)
        steps.append(EngineChunk(ids, prompt, sent, cached))
    if not call.stream:
        # One answer at the end: a hold or a failure within the generation comes before it.
        if not held and script.hold_after is not None and script.hold_after <= len(generated):
            steps.append(_Hold())
        if failure is not None and fail_at is not None and fail_at <= len(generated):
            steps.append(failure)
            return steps
    steps.append(
        EngineDone(
            finish_reason=finish,
            prompt_tokens=prompt,
            completion_tokens=len(generated),
            token_ids=[] if call.stream else list(generated),
            matched_token_id=matched_id,
            matched_stop_str=matched_str,
            cached_tokens=cached,
        )
    )
    return steps


@dataclass
class Playbook:
    """The engines of a deployment by worker URL, as an `EngineConnector` `clients=` factory:
    a URL with no engine is a worker nothing answers at."""

    engines: dict[str, PlaybackEngine] = field(default_factory=dict)

    def add(self, url: str, engine: PlaybackEngine) -> PlaybackEngine:
        self.engines[url.rstrip("/")] = engine
        engine.target = url
        return engine

    async def __call__(self, target: Target) -> tuple[str, EngineClient]:
        engine = self.engines.get(target.url.rstrip("/"))
        if engine is None:
            raise WorkerUnreachable(f"no engine answers at {target.url}")
        return engine.runtime, engine
