"""One engine call's answers turned into journal events, sans I/O.

The live gRPC backend feeds it what the engine sends; offline replay feeds it the recorded
`tokens` events. Both therefore make the same decisions: `message_start` with the engine's
first answer, a `tokens` event then the blocks for each chunk, the end from the engine's
final message — or, when the gateway matched a stop sequence itself, from the counts seen so
far (the caller then stops reading and aborts the engine).
"""

from __future__ import annotations

from typing import Any

from journal.events import Block, Event, Tokens
from smg.pipeline.generation import Generation


class Attempt:
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
