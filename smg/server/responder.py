"""Carries out a projection's actions on a Sanic request: the only place bytes are written."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from smg.projection import Action, End, Head, Send, Whole


class Responder:
    __slots__ = ("_request", "_stream", "bytes_sent", "status")

    def __init__(self, request: Any) -> None:
        self._request = request
        self._stream: Any = None
        self.bytes_sent = 0
        self.status: int | None = None

    @property
    def responded(self) -> bool:
        return self.status is not None

    async def run(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                await self._stream.send(action.data)
                self.bytes_sent += len(action.data)
            elif isinstance(action, Whole):
                headers = dict(action.headers)
                content_type = headers.pop("content-type", "application/json")
                self.status = action.status
                response = await self._request.respond(status=action.status, headers=headers, content_type=content_type)
                await response.send(action.body, end_stream=True)
                self.bytes_sent += len(action.body)
            elif isinstance(action, Head):
                headers = dict(action.headers)
                content_type = headers.pop("content-type", "text/event-stream")
                self.status = action.status
                self._stream = await self._request.respond(
                    status=action.status, headers=headers, content_type=content_type
                )
            elif isinstance(action, End):
                if self._stream is not None:
                    await self._stream.eof()
