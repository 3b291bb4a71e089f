"""One generation as a sans-IO session: engine answers in, journal events and decisions out.

A session lasts across the attempts of one generation (the `Generation` and its settings are
built once; each attempt on a worker starts its own counts). Whoever reads an engine — the
gRPC and ZMQ connectors, the prefill/decode connector's decode leg, offline replay reading
recorded `tokens` — feeds it what the engine said (`feed` an `EngineChunk` or `EngineDone`,
`fail` an `EngineError`, `end` when the stream closed without its end) and yields the events it
returns. After each call the reader asks `over` (stop reading) and, when it stops,
`abort_engine` (the engine never settled the request: tell it to stop); `outcome` says how a
failed attempt ends (retried elsewhere, worker down, or answered with an error). Nothing here
awaits.

The decisions, in one place:
- `message_start` waits for the engine's first answer, so a refusal before it (a prompt the
  engine finds too long, bad parameters) is an ordinary error response;
- a stop sequence the gateway matched itself ends the message at once, the engine unsettled;
- an engine's `finish_reason: error` is a failure, never an empty success (vLLM ends a request
  it could not run this way);
- a failure before any output on an engine that did not answer is retried on another worker
  (no event); the engine gone mid-answer takes its worker out; any other failure is the
  client's error (`engine_failure`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from journal.events import Block, Error, Event, Rendered, Tokens
from smg.pipeline.engine import EngineChunk, EngineDone, EngineError, EngineEvent, engine_failure
from smg.pipeline.generation import Generation
from smg.pipeline.output import build_stages
from smg.pipeline.prepare import Prepared, settings_record
from smg.protocol.errors import ApiError


def error_event(err: ApiError, stage: str = "engine") -> Error:
    """A failure after the request reached an engine, as the journal and the client get it."""
    return Error(
        stage=stage,
        status=err.status,
        error_type=err.type,
        message=err.message,
        code=err.code,
        headers=err.response_headers(),
        detail=err.detail,
    )


@dataclass(frozen=True)
class Outcome:
    """How a failed attempt ends."""

    error: ApiError
    engine_message: str  # the engine's own words, for the log
    retry: bool = False  # nothing reached the client and nothing answered: another worker may take it
    worker_down: bool = False  # the engine went away mid-answer: its worker is out until a health check

    @property
    def status(self) -> int:
        return self.error.status


class _Attempt:
    """One engine call's answers turned into events: `message_start` with the engine's first
    answer, a `tokens` event then the blocks for each chunk, the end from the engine's final
    message or, when the gateway matched a stop sequence itself, from the counts seen so far."""

    def __init__(self, generation: Generation, prompt_tokens: int) -> None:
        self.generation = generation
        self._own_prompt_tokens = prompt_tokens  # the gateway's count, when the engine gives none
        self.started = False  # message_start was sent
        self.produced = False  # some output token arrived
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finished = False  # the message is complete (message_stop produced)

    @property
    def stopped(self) -> bool:
        """The gateway matched a stop sequence: the engine's further output is unwanted."""
        return self.generation.stopped

    def chunk(self, ids: list[int], prompt_tokens: int, completion_tokens: int) -> list[Event]:
        """An engine chunk (`completion_tokens` is the running total). After it, if `stopped`,
        call `stop()`."""
        events = self._start()
        self.produced = self.produced or bool(ids)
        self.prompt_tokens = prompt_tokens or self.prompt_tokens
        self.completion_tokens = completion_tokens
        events.append(Tokens(ids=ids, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))
        events += self._blocks(self.generation.feed(ids))
        return events

    def done(
        self,
        ids: list[int],
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        matched_token_id: int | None = None,
        matched_stop_str: str | None = None,
    ) -> list[Event]:
        """The engine's final message: the message ends here."""
        events = self._start()
        self.produced = True
        self.prompt_tokens = prompt_tokens or self.prompt_tokens
        self.completion_tokens = completion_tokens
        matched: int | str | None = matched_token_id if matched_token_id is not None else matched_stop_str
        events.append(
            Tokens(
                ids=ids,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                finish_reason=finish_reason,
                matched_stop=matched,
            )
        )
        events += self._blocks(self.generation.feed(ids))
        if self.stopped:
            return events + self.stop()
        self.finished = True
        return events + self._blocks(
            self.generation.finish(
                finish_reason,
                self.prompt_tokens or self._own_prompt_tokens,
                completion_tokens,
                matched_token_id=matched_token_id,
                matched_stop_str=matched_stop_str,
            )
        )

    def stop(self) -> list[Event]:
        """End the message at the stop sequence the gateway matched."""
        self.finished = True
        return self._blocks(
            self.generation.finish("stop", self.prompt_tokens or self._own_prompt_tokens, self.completion_tokens)
        )

    def _start(self) -> list[Event]:
        if self.started:
            return []
        self.started = True
        return self._blocks(self.generation.start())

    @staticmethod
    def _blocks(payloads: list[dict[str, Any]]) -> list[Event]:
        return [Block(payload) for payload in payloads]


class Session:
    """One generation's engine answers turned into events, attempt after attempt."""

    def __init__(self, generation: Generation, prompt_tokens: int) -> None:
        self.generation = generation
        self._prompt_tokens = prompt_tokens
        self._attempt = _Attempt(generation, prompt_tokens)
        self.settled = False  # the engine finished the request or failed it: nothing to abort
        self.over = False  # nothing more is wanted from this attempt's engine
        self.outcome: Outcome | None = None  # set when the attempt failed

    @classmethod
    def start(
        cls, prepared: Prepared, engine_eos_ids: Sequence[int], stop_ids: Sequence[int]
    ) -> tuple[Session, Rendered]:
        """The session of a prepared generation and its `rendered` event, at its first attempt:
        the first engine's EOS ids join the tokenizer's; `stop_ids` are those the engine was sent."""
        settings, plan = prepared.settings, prepared.plan
        settings.eos_token_ids = sorted(set(engine_eos_ids) | set(prepared.tokenizer.eos_token_ids))
        constraint = {"type": plan.constraint[0], "value": plan.constraint[1]} if plan.constraint else None
        rendered = Rendered(
            prompt_tokens=len(prepared.prompt.ids),
            prompt_digest=prepared.prompt.digest,
            stop_ids=list(stop_ids),
            constraint=constraint,
            tokenizer=prepared.source,
            settings=settings_record(settings),
        )
        generation = Generation(prepared.tokenizer, settings, build_stages(settings))
        return cls(generation, len(prepared.prompt.ids)), rendered

    def attempt(self) -> None:
        """A new attempt on another worker: its own counts, the same generation."""
        self._attempt = _Attempt(self.generation, self._prompt_tokens)
        self.settled = self.over = False
        self.outcome = None

    @property
    def started(self) -> bool:
        """`message_start` was produced in this attempt."""
        return self._attempt.started

    @property
    def abort_engine(self) -> bool:
        """The reader left before the engine settled the request: the engine is to be told to stop."""
        return not self.settled

    def feed(self, item: EngineEvent) -> list[Event]:
        """One engine answer."""
        attempt = self._attempt
        if isinstance(item, EngineChunk):
            events = attempt.chunk(item.token_ids, item.prompt_tokens, item.completion_tokens)
            if attempt.stopped:
                self.over = True
                events += attempt.stop()
            return events
        assert isinstance(item, EngineDone)
        if item.finish_reason == "error":
            return self.fail(EngineError("INTERNAL", "the engine failed the request (finish reason: error)"))
        self.settled = self.over = True
        return attempt.done(
            item.token_ids,
            item.finish_reason,
            item.prompt_tokens,
            item.completion_tokens,
            matched_token_id=item.matched_token_id,
            matched_stop_str=item.matched_stop_str,
        )

    def end(self) -> list[Event]:
        """The engine closed its stream without ending the generation."""
        return self.fail(EngineError("INTERNAL", "the engine closed the stream without completing the generation"))

    def fail(self, exc: EngineError) -> list[Event]:
        """The engine refused or failed the call: its `error` event, unless another worker may
        take the request."""
        self.settled = self.over = True
        started = self._attempt.started
        err = engine_failure(exc, started=started)
        if exc.unavailable and not started:
            self.outcome = Outcome(err, exc.message, retry=True)
            return []
        self.outcome = Outcome(err, exc.message, worker_down=exc.code == "UNAVAILABLE")
        return [error_event(err)]
