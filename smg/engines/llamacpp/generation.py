"""One generation inside llama.cpp: the callback that reads its chunks and decides where it ends.

`xllamacpp`'s `handle_completions` blocks its caller and calls back once per token, on that
caller's thread. `Run.on_chunk` reads the token ids (`logprobs: 1` puts them in every chunk),
ends the output on a stop token id or a stop string (llama.cpp knows neither), records how it
ended, and hands the ids to the RPC's event loop; returning True ends the generation in
llama.cpp, which is also how an abort or a caller that went away takes effect.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from smg.engines.llamacpp.sampling import Plan

# llama.cpp's HTTP error codes as gRPC statuses.
_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


END = object()  # the last item a Run puts in its queue


@dataclass
class Run:
    """One generation: fed by llama.cpp's callback on a worker thread, read by the RPC's loop."""

    plan: Plan
    eos_token_ids: frozenset[int]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    matched_token_id: int | None = None
    matched_stop_str: str | None = None
    cached_tokens: int = 0
    error: tuple[grpc.StatusCode, str] | None = None
    aborted: threading.Event = field(default_factory=threading.Event)
    gone: threading.Event = field(default_factory=threading.Event)

    def _send(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def on_chunk(self, chunk: Any) -> bool:
        """llama.cpp's callback: True ends the generation."""
        if self.aborted.is_set() or self.gone.is_set():
            return True
        if not isinstance(chunk, dict):
            return False
        if "error" in chunk:
            self.error = _error(chunk["error"])
            return True
        choice = (chunk.get("choices") or [{}])[0]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        ended = choice.get("finish_reason")
        if self.finish_reason is not None:
            # Ended here already: only llama.cpp's closing chunk (with the usage) is still welcome.
            return not ended
        new: list[int] = []
        cut = False
        for entry in (choice.get("logprobs") or {}).get("content") or []:
            token = int(entry["id"])
            new.append(token)
            self.ids.append(token)
            if token in self.plan.stop_token_ids:
                self.finish_reason, self.matched_token_id, cut = "stop", token, True
                break
            if token in self.eos_token_ids and not self.plan.ignore_eos:
                # llama.cpp ends on its end-of-generation tokens itself and then sends the usage.
                self.finish_reason, self.matched_token_id = "stop", token
                break
        if self.plan.stop and self.finish_reason is None:
            self.text += str(choice.get("text") or "")
            tail = self.text[-(max(len(s) for s in self.plan.stop) + 64) :]
            hit = next((s for s in self.plan.stop if s in tail), None)
            if hit is not None:
                self.finish_reason, self.matched_stop_str, cut = "stop", hit, True
        if new:
            self._send(new)
        if self.finish_reason is None and ended:
            self.finish_reason = "length" if ended == "length" else "stop"
        return cut and not ended

    def execute(self, generate: Callable[[dict[str, Any], Callable[[Any], bool]], Any]) -> None:
        """On a worker thread: run the generation to its end, then tell the loop."""
        try:
            generate(self.plan.body, self.on_chunk)
        except Exception as exc:  # the loop must hear of the end whatever happened
            self.error = (grpc.StatusCode.INTERNAL, f"llama.cpp failed: {exc}")
        finally:
            self._send(END)


def _error(detail: Any) -> tuple[grpc.StatusCode, str]:
    """llama.cpp's `{"code": 400, "message": …}` as a gRPC status and message."""
    if not isinstance(detail, dict):
        return grpc.StatusCode.INTERNAL, str(detail)
    code = detail.get("code")
    status = _STATUS.get(code, grpc.StatusCode.INTERNAL) if isinstance(code, int) else grpc.StatusCode.INTERNAL
    return status, str(detail.get("message") or detail)
