"""One engine call read through the generation session, and the router told how it ended.

`EngineCalls.drive` is the I/O around `smg.pipeline.session.Session`: it reads the engine's
stream, feeds the session each answer (or the engine's failure), yields the events it returns,
and stops reading when the session says so. A call left before the engine settled it (the
gateway matched a stop sequence, the client went away) is aborted in the background; the
aborts still in flight end with the connector. `settle` turns the session's outcome into the
lease's, the same for a single engine and a decode leg.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator

from journal.events import Event
from smg.backends.base import Failure, Lease
from smg.backends.grpc.types import EngineClient, EngineError, EngineEvent, GenerateCall
from smg.pipeline.session import Session

log = logging.getLogger("smg.grpc")


class EngineCalls:
    """Engine calls driven through sessions, and the aborts of those left unsettled."""

    def __init__(self) -> None:
        self._aborts: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await asyncio.gather(*self._aborts, return_exceptions=True)

    async def drive(
        self,
        client: EngineClient,
        call: GenerateCall,
        session: Session,
        stream: AsyncIterator[EngineEvent] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """One engine call (`stream`: the call already started), its answers through `session`."""
        if stream is None:
            stream = client.generate(call)
        try:
            try:
                async for item in stream:
                    for event in session.feed(item):
                        yield event
                    if session.over:
                        return
                events = session.end()
            except EngineError as exc:
                events = session.fail(exc)
            for event in events:
                yield event
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            if session.abort_engine:
                self.abort(client, call.request_id)

    def abort(self, client: EngineClient, request_id: str) -> None:
        """Tell the engine to stop; the request is over for us whether or not it confirms."""

        async def abort() -> None:
            try:
                await client.abort(request_id)
            except EngineError as exc:
                log.info("abort of %s not confirmed: %s", request_id, exc.message or exc.code)

        task = asyncio.get_running_loop().create_task(abort(), name=f"smg-abort-{request_id}")
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)


def settle(lease: Lease, session: Session, role: str = "worker") -> bool:
    """Tell the router how the attempt on `lease` ended. True: another worker is to be tried
    (the engine did not answer and nothing reached the client)."""
    outcome = session.outcome
    if outcome is None:
        lease.answered(200)
        return False
    if outcome.retry:
        log.warning("%s %s unreachable (%s)", role, lease.target.url, outcome.engine_message)
        lease.failed(Failure("unavailable", outcome.error))
        return True
    if outcome.worker_down:
        # The engine went away mid-answer: the worker is down until a health check passes.
        lease.failed(Failure("unavailable", outcome.error, retryable=False))
    else:
        lease.answered(outcome.status)
    return False
