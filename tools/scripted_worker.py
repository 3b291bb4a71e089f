"""A scripted HTTP worker: the Messages API surface of an inference engine, answered as a test says.

The worker serves ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (recorded, then
answered from a per-path FIFO of scripted answers or with a default echo), ``GET /v1/models`` and
``GET /health``. Tests drive it through a small JSON control API:

- ``POST /_script`` ``{"path": "/v1/messages", "answers": [Answer, ...]}`` queues answers;
- ``GET /_script`` shows how many answers are still queued per path;
- ``GET /_received`` / ``DELETE /_received`` read or clear the recorded requests;
- ``GET /_in_flight``: the requests being answered now and at most (see below);
- ``GET /_models_received`` lists the headers of each ``GET /v1/models`` (kept apart, so that
  discovery does not count as traffic);
- ``POST /_health`` ``{"healthy": false}`` makes ``/health`` answer 503;
- ``POST /_reset`` clears queues, records and health.

An Answer is a JSON object; scripts are validated when queued, so a bad script answers 400 there
and never breaks the serving path. Keys (all optional):

- ``status`` (int, default 200), ``headers`` (str -> str), ``delay_ms`` (sleep before the
  status line);
- one body kind: ``json`` (any JSON value), ``body`` (raw text), ``sse`` (list of
  ``{"event": name, "data": obj|str}`` or ``{"raw": text}`` / ``{"raw_b64": bytes}`` written one per write, with
  ``chunk_delay_ms`` between them), ``stream_echo: true`` (the default streaming echo), or
  ``drop: true`` (close the connection without answering);
- ``drop_after`` (with ``sse`` or ``stream_echo``): close the connection after that many events.
- ``hold_after`` (with ``sse`` or ``stream_echo``): after that many events, wait for
  ``POST /_release`` before writing the rest (proves a relay streams as frames arrive).
- ``when_body_contains`` (str): the answer is only for a request whose body contains it; a
  request takes the first queued answer it fits, so answers keyed on a prompt's marker do not
  depend on the order concurrent requests arrive in. ``repeat: true`` keeps the answer queued
  for every later request it fits.

``GET /_in_flight`` says ``{"in_flight": n, "max": m}``: the requests to the scriptable paths
the worker is answering now, and the most it answered at once since the last reset (each
record of ``/_received`` has ``in_flight``, the count on its arrival, itself included); this
proves a client's concurrency limit without timing it.

An answer with no body kind is the path's default answer when its status is 200, else an empty body.

Run: ``python -m tools.scripted_worker --host 127.0.0.1 --port N [--models a,b]
[--max-model-len 4096] [--api-format openai|anthropic] [--owned-by NAME]`` (``--owned-by`` is the
OpenAI listing's ``owned_by``, default ``scripted``: ``vllm`` makes the gateway take it for vLLM;
``--dp-size N`` makes ``GET /server_info`` answer SGLang's ``{"dp_size": N, …}``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import re
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from sanic import Request, Sanic
from sanic.response import HTTPResponse

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
SCRIPTABLE_PATHS = (MESSAGES, COUNT_TOKENS)

_BODY_KINDS = ("json", "body", "sse", "stream_echo", "drop")
_ANSWER_KEYS = frozenset(
    (
        *_BODY_KINDS,
        "status",
        "headers",
        "delay_ms",
        "chunk_delay_ms",
        "drop_after",
        "hold_after",
        "when_body_contains",
        "repeat",
    )
)
_WORD = re.compile(r"\s*\S+")


class ScriptError(ValueError):
    """A control request the worker cannot accept; rendered as a 400."""


@dataclass(frozen=True)
class WorkerConfig:
    """How the worker describes itself."""

    models: tuple[str, ...] = ("scripted-model",)
    max_model_len: int = 4096
    api_format: str = "openai"
    owned_by: str = "scripted"
    dp_size: int | None = None  # answered by GET /server_info (SGLang's), when set


@dataclass
class Answer:
    """One validated scripted answer. ``frames`` are pre-encoded SSE events."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    kind: str = "default"
    payload: Any = None
    frames: list[bytes] = field(default_factory=list)
    delay: float = 0.0
    chunk_delay: float = 0.0
    drop_after: int | None = None
    hold_after: int | None = None
    when_body_contains: str | None = None
    repeat: bool = False


@dataclass
class _State:
    queues: dict[str, deque[Answer]] = field(default_factory=dict)
    received: list[dict[str, Any]] = field(default_factory=list)
    model_requests: list[dict[str, Any]] = field(default_factory=list)  # GET /v1/models, headers only
    healthy: bool = True
    released: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    max_in_flight: int = 0

    def reset(self) -> None:
        self.queues.clear()
        self.received.clear()
        self.model_requests.clear()
        self.healthy = True
        self.in_flight = self.max_in_flight = 0
        self.released.set()
        self.released = asyncio.Event()

    def next_answer(self, path: str, body: str = "") -> Answer | None:
        """The first queued answer that fits a request with this body (see the module docstring)."""
        queue = self.queues.get(path)
        if not queue:
            return None
        for i, answer in enumerate(queue):
            if answer.when_body_contains is None or answer.when_body_contains in body:
                if not answer.repeat:
                    del queue[i]
                return answer
        return None


# --- script validation -------------------------------------------------------------------------


def _seconds(obj: dict[str, Any], key: str) -> float:
    value = obj.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ScriptError(f"{key} must be a non-negative number")
    return float(value) / 1000.0


def sse_frame(event: str | None, data: Any) -> bytes:
    """Encode one SSE event; ``data`` that is not a string is serialized as JSON."""
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    return head + b"data: " + payload + b"\n\n"


def _parse_frame(item: Any) -> bytes:
    if not isinstance(item, dict):
        raise ScriptError("each sse entry must be an object")
    if "raw" in item:
        if not isinstance(item["raw"], str):
            raise ScriptError("sse raw must be a string")
        return item["raw"].encode()
    if "raw_b64" in item:  # exact bytes, e.g. half of a multi-byte character
        try:
            return base64.b64decode(item["raw_b64"], validate=True)
        except (TypeError, ValueError) as exc:
            raise ScriptError(f"sse raw_b64 is not base64: {exc}") from None
    event = item.get("event")
    if event is not None and not isinstance(event, str):
        raise ScriptError("sse event must be a string")
    if "data" not in item:
        raise ScriptError("sse entry needs data (or raw)")
    return sse_frame(event, item["data"])


def parse_answer(obj: Any) -> Answer:
    """Validate one scripted answer; raises ScriptError on anything malformed."""
    if not isinstance(obj, dict):
        raise ScriptError("an answer must be an object")
    unknown = set(obj) - _ANSWER_KEYS
    if unknown:
        raise ScriptError(f"unknown answer keys: {sorted(unknown)}")
    kinds = [k for k in _BODY_KINDS if k in obj and obj[k] is not False]
    if len(kinds) > 1:
        raise ScriptError(f"an answer has one body kind, got {kinds}")
    status = obj.get("status", 200)
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ScriptError("status must be an integer in 100..599")
    headers = obj.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ScriptError("headers must map strings to strings")
    answer = Answer(
        status=status,
        headers={k.lower(): v for k, v in headers.items()},
        kind=kinds[0] if kinds else "default",
        delay=_seconds(obj, "delay_ms"),
        chunk_delay=_seconds(obj, "chunk_delay_ms"),
    )
    if answer.kind == "json":
        answer.payload = orjson.dumps(obj["json"])
    elif answer.kind == "body":
        if not isinstance(obj["body"], str):
            raise ScriptError("body must be a string")
        answer.payload = obj["body"].encode()
    elif answer.kind == "sse":
        if not isinstance(obj["sse"], list):
            raise ScriptError("sse must be a list")
        answer.frames = [_parse_frame(item) for item in obj["sse"]]
    elif answer.kind in ("stream_echo", "drop") and obj[answer.kind] is not True:
        raise ScriptError(f"{answer.kind} must be true")
    if "drop_after" in obj:
        drop_after = obj["drop_after"]
        if isinstance(drop_after, bool) or not isinstance(drop_after, int) or drop_after < 0:
            raise ScriptError("drop_after must be a non-negative integer")
        if answer.kind not in ("sse", "stream_echo"):
            raise ScriptError("drop_after needs sse or stream_echo")
        answer.drop_after = drop_after
    if "hold_after" in obj:
        hold_after = obj["hold_after"]
        if isinstance(hold_after, bool) or not isinstance(hold_after, int) or hold_after < 0:
            raise ScriptError("hold_after must be a non-negative integer")
        if answer.kind not in ("sse", "stream_echo"):
            raise ScriptError("hold_after needs sse or stream_echo")
        answer.hold_after = hold_after
    when = obj.get("when_body_contains")
    if when is not None and (not isinstance(when, str) or not when):
        raise ScriptError("when_body_contains must be a non-empty string")
    answer.when_body_contains = when
    repeat = obj.get("repeat", False)
    if not isinstance(repeat, bool):
        raise ScriptError("repeat must be a boolean")
    answer.repeat = repeat
    return answer


# --- default answers ---------------------------------------------------------------------------


def _texts(value: Any) -> list[str]:
    """Every text in a system prompt or message content (strings, text and tool_result blocks)."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    if isinstance(value, list):
        for block in value:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    out.append(block["text"])
                elif block.get("type") == "tool_result":
                    out.extend(_texts(block.get("content")))
    return out


def _words(texts: list[str]) -> int:
    return sum(len(t.split()) for t in texts)


def _input_words(body: dict[str, Any]) -> int:
    texts = _texts(body.get("system"))
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            texts.extend(_texts(message.get("content")))
    return _words(texts)


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return "".join(_texts(message.get("content")))
    return ""


def _echo(body: dict[str, Any], config: WorkerConfig) -> tuple[str, str, int, int]:
    text = f"echo: {_last_user_text(body)}"
    model = body.get("model")
    model = model if isinstance(model, str) else config.models[0]
    return text, model, _input_words(body), len(text.split())


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def echo_message(body: dict[str, Any], config: WorkerConfig) -> dict[str, Any]:
    """The default non-streaming answer: an assistant message echoing the last user text."""
    text, model, input_tokens, output_tokens = _echo(body, config)
    return {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": _usage(input_tokens, output_tokens),
    }


def echo_frames(body: dict[str, Any], config: WorkerConfig) -> list[bytes]:
    """The default streaming answer, in the spec's event order, one text_delta per word."""
    text, model, input_tokens, output_tokens = _echo(body, config)
    start = {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(0, 0),
    }
    frames = [
        sse_frame("message_start", {"type": "message_start", "message": start}),
        sse_frame(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for word in _WORD.findall(text):
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": word},
        }
        frames.append(sse_frame("content_block_delta", delta))
    frames += [
        sse_frame("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse_frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": _usage(input_tokens, output_tokens),
            },
        ),
        sse_frame("message_stop", {"type": "message_stop"}),
    ]
    return frames


def models_listing(config: WorkerConfig) -> dict[str, Any]:
    """``GET /v1/models`` in the configured API shape."""
    if config.api_format == "anthropic":
        data = [
            {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
            for m in config.models
        ]
        return {
            "data": data,
            "has_more": False,
            "first_id": config.models[0] if config.models else None,
            "last_id": config.models[-1] if config.models else None,
        }
    data = [
        {
            "id": m,
            "object": "model",
            "created": 0,
            "owned_by": config.owned_by,
            "max_model_len": config.max_model_len,
        }
        for m in config.models
    ]
    return {"object": "list", "data": data}


# --- serving -----------------------------------------------------------------------------------


def _json(obj: Any, status: int = 200) -> HTTPResponse:
    return HTTPResponse(orjson.dumps(obj), status=status, content_type="application/json")


def _control_error(message: str) -> HTTPResponse:
    return _json({"error": message}, status=400)


def _invalid_request(message: str) -> HTTPResponse:
    error = {"type": "invalid_request_error", "message": message}
    return _json({"type": "error", "error": error}, status=400)


def _record(state: _State, request: Request) -> dict[str, Any] | None:
    """Record the request; return its body when it is a JSON object."""
    raw = request.body.decode("utf-8", errors="replace")
    try:
        parsed = orjson.loads(request.body) if request.body else None
    except orjson.JSONDecodeError:
        parsed = None
    state.received.append(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": raw,
            "json": parsed,
            "time": time.time(),
            "in_flight": state.in_flight,
        }
    )
    return parsed if isinstance(parsed, dict) else None


async def _drop(request: Request) -> None:
    """Close the connection mid-exchange (after flushing what was written).

    Sanic cancels this handler once the transport reports the loss, so this never returns.
    """
    request.transport.close()
    await asyncio.Event().wait()


async def _stream(request: Request, answer: Answer, frames: list[bytes], state: _State) -> None:
    headers = {"content-type": "text/event-stream", "cache-control": "no-cache", **answer.headers}
    response = await request.respond(status=answer.status, headers=headers)
    for i, frame in enumerate(frames):
        if answer.drop_after is not None and i >= answer.drop_after:
            await _drop(request)
        if answer.hold_after is not None and i == answer.hold_after:
            await state.released.wait()  # until the test calls POST /_release
        if i and answer.chunk_delay:
            await asyncio.sleep(answer.chunk_delay)
        await response.send(frame)
    if answer.drop_after is not None and answer.drop_after >= len(frames):
        await _drop(request)
    await response.eof()


async def _answer(
    request: Request, path: str, config: WorkerConfig, state: _State
) -> HTTPResponse | None:
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    try:
        return await _answer_one(request, path, config, state)
    finally:
        state.in_flight -= 1


async def _answer_one(
    request: Request, path: str, config: WorkerConfig, state: _State
) -> HTTPResponse | None:
    body = _record(state, request)
    answer = state.next_answer(path, request.body.decode("utf-8", errors="replace")) or Answer()
    if answer.delay:
        await asyncio.sleep(answer.delay)
    kind = answer.kind
    if kind == "default" and answer.status != 200:
        kind = "empty"
    if kind == "drop":
        await _drop(request)
    if kind in ("sse", "stream_echo") or (
        kind == "default" and body and body.get("stream") is True
    ):
        frames = answer.frames if kind == "sse" else echo_frames(body or {}, config)
        await _stream(request, answer, frames, state)
        return None
    if kind == "default":
        if body is None:
            return _invalid_request("request body must be a JSON object")
        result = (
            {"input_tokens": _input_words(body)}
            if path == COUNT_TOKENS
            else echo_message(body, config)
        )
        return HTTPResponse(
            orjson.dumps(result), headers=answer.headers, content_type="application/json"
        )
    if kind == "json":
        content_type = answer.headers.get("content-type", "application/json")
        return HTTPResponse(answer.payload, answer.status, answer.headers, content_type)
    payload = answer.payload if kind == "body" else b""
    content_type = answer.headers.get("content-type", "text/plain; charset=utf-8")
    return HTTPResponse(payload, answer.status, answer.headers, content_type)


def _control_body(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(request.body) if request.body else {}
    except orjson.JSONDecodeError as exc:
        raise ScriptError(f"invalid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ScriptError("control body must be a JSON object")
    return body


def create_app(config: WorkerConfig, name: str = "scripted_worker") -> Sanic:
    """Build the worker's Sanic app; state lives on ``app.ctx.state``."""
    app = Sanic(name)
    app.config.update(
        {
            "FALLBACK_ERROR_FORMAT": "json",
            "RESPONSE_TIMEOUT": 3600,
            "REQUEST_TIMEOUT": 3600,
            "GRACEFUL_SHUTDOWN_TIMEOUT": 1.0,
            "GRACEFUL_TCP_CLOSE_TIMEOUT": 0.5,
        }
    )
    state = _State()
    app.ctx.state = state

    @app.post(MESSAGES, name="messages")
    async def messages(request: Request) -> HTTPResponse | None:
        return await _answer(request, MESSAGES, config, state)

    @app.post(COUNT_TOKENS, name="count_tokens")
    async def count_tokens(request: Request) -> HTTPResponse | None:
        return await _answer(request, COUNT_TOKENS, config, state)

    @app.get("/v1/models", name="models")
    async def models(request: Request) -> HTTPResponse:
        state.model_requests.append({"headers": {k.lower(): v for k, v in request.headers.items()}})
        return _json(models_listing(config))

    @app.get("/_models_received", name="models_received")
    async def models_received(request: Request) -> HTTPResponse:
        return _json({"requests": state.model_requests})

    @app.get("/server_info", name="server_info")
    async def server_info(request: Request) -> HTTPResponse:
        if config.dp_size is None:
            return _json({"error": "not found"}, status=404)
        return _json({"dp_size": config.dp_size, "model_path": config.models[0] if config.models else ""})

    @app.get("/health", name="health")
    async def health(request: Request) -> HTTPResponse:
        if state.healthy:
            return _json({"status": "ok"})
        return _json({"status": "unhealthy"}, status=503)

    @app.post("/_script", name="script")
    async def script(request: Request) -> HTTPResponse:
        try:
            body = _control_body(request)
            path = body.get("path", MESSAGES)
            if path not in SCRIPTABLE_PATHS:
                raise ScriptError(f"path must be one of {list(SCRIPTABLE_PATHS)}")
            raw_answers = body.get("answers")
            if not isinstance(raw_answers, list):
                raise ScriptError("answers must be a list")
            answers = [parse_answer(a) for a in raw_answers]
        except ScriptError as exc:
            return _control_error(str(exc))
        queue = state.queues.setdefault(path, deque())
        queue.extend(answers)
        return _json({"path": path, "queued": len(queue)})

    @app.get("/_script", name="pending")
    async def pending(request: Request) -> HTTPResponse:
        return _json({"pending": {p: len(q) for p, q in state.queues.items()}})

    @app.get("/_received", name="received")
    async def received(request: Request) -> HTTPResponse:
        return _json({"requests": state.received})

    @app.get("/_in_flight", name="in_flight")
    async def in_flight(request: Request) -> HTTPResponse:
        return _json({"in_flight": state.in_flight, "max": state.max_in_flight})

    @app.delete("/_received", name="clear_received")
    async def clear_received(request: Request) -> HTTPResponse:
        state.received.clear()
        return _json({"requests": []})

    @app.post("/_health", name="set_health")
    async def set_health(request: Request) -> HTTPResponse:
        try:
            healthy = _control_body(request).get("healthy")
        except ScriptError as exc:
            return _control_error(str(exc))
        if not isinstance(healthy, bool):
            return _control_error("healthy must be a boolean")
        state.healthy = healthy
        return _json({"healthy": healthy})

    @app.post("/_release", name="release")
    async def release(request: Request) -> HTTPResponse:
        state.released.set()
        state.released = asyncio.Event()
        return _json({"released": True})

    @app.post("/_reset", name="reset")
    async def reset(request: Request) -> HTTPResponse:
        state.reset()
        return _json({"reset": True})

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.scripted_worker", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--models", default="scripted-model", help="comma-separated model ids")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--api-format", choices=("openai", "anthropic"), default="openai")
    parser.add_argument("--owned-by", default="scripted")
    parser.add_argument("--dp-size", type=int, default=None, help="GET /server_info's dp_size (else 404)")
    args = parser.parse_args(argv)
    models = tuple(m for m in (s.strip() for s in args.models.split(",")) if m)
    config = WorkerConfig(
        models or ("scripted-model",), args.max_model_len, args.api_format, args.owned_by, args.dp_size
    )
    app = create_app(config, name=f"scripted_worker_{args.port}")
    app.run(host=args.host, port=args.port, single_process=True, access_log=False, motd=False)


if __name__ == "__main__":
    main()
