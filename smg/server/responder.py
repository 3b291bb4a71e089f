"""Carries out a projection's actions on a Sanic request: the only place bytes are written.

The SSE frames one event gives (`message_start` with the head, a block's stop and the next
block's start, `message_delta` with `message_stop` and the end of the stream) go out in one
write: one chunk, one syscall, instead of one per frame. Nothing is held back for later
events, so the first frame is never delayed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from smg.projection import Action, End, Head, Send, Whole


class Responder:
    __slots__ = ("_request", "_stream", "bytes_sent", "status", "finished")

    def __init__(self, request: Any) -> None:
        self._request = request
        self._stream: Any = None
        self.bytes_sent = 0
        self.status: int | None = None
        self.finished = False  # the last byte of the response is written

    @property
    def responded(self) -> bool:
        return self.status is not None

    async def run(self, actions: Iterable[Action]) -> None:
        pending: list[bytes] = []  # consecutive Send data, written together
        for action in actions:
            if isinstance(action, Send):
                pending.append(action.data)
                continue
            if isinstance(action, End):
                if self._stream is not None:
                    if pending:
                        await self._send(pending, end=True)
                        pending = []
                    else:
                        await self._stream.eof()
                    self.finished = True
                continue
            if pending:
                await self._send(pending)
                pending = []
            if isinstance(action, Whole):
                headers = dict(action.headers)
                content_type = headers.pop("content-type", "application/json")
                self.status = action.status
                response = await self._request.respond(status=action.status, headers=headers, content_type=content_type)
                await response.send(action.body, end_stream=True)
                self.bytes_sent += len(action.body)
                self.finished = True
            elif isinstance(action, Head):
                headers = dict(action.headers)
                content_type = headers.pop("content-type", "text/event-stream")
                self.status = action.status
                self._stream = await self._request.respond(
                    status=action.status, headers=headers, content_type=content_type
                )
        if pending:
            await self._send(pending)

    async def _send(self, pieces: list[bytes], end: bool = False) -> None:
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        await self._stream.send(data, end_stream=end)
        self.bytes_sent += len(data)
