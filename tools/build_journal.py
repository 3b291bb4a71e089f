"""Build a large journal of synthetic operator traffic through the real `JournalWriter`.

    python -m tools.build_journal /tmp/journal-1m.db --requests 1000000

Requests look like a busy gateway's: keys (`x-api-key`, redacted to a fingerprint by the
writer), `metadata.user_id`s, Claude Code sessions whose turns resend a growing history,
W3C `traceparent`s, several models and workers, streams (some cut mid-stream, some hung up)
and non-streamed relays, errors with their messages, arrival times spread over `--span`.
Deterministic for a seed. Used by the scale tests (100k requests) and to time queries at 1M.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from journal.events import Block, Completed, Error, Event, Received, Routed, Upstream, Validated
from journal.prices import PriceTable, load
from journal.writer import JournalWriter

MODELS = ("claude-sonnet-4", "claude-haiku-4", "qwen3-8b")
WORKERS = tuple(f"http://10.0.0.{n}:8000" for n in range(1, 5))
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
    "romeo sierra tango uniform victor whiskey xray yankee zulu refactor parser tokenizer journal gateway "
    "latency overloaded timeout stream replay inspector conversation session tenant worker"
).split()
T0 = 1_750_000_000.0


@dataclass(frozen=True)
class Traffic:
    """What `requests` generates: how many, from when, over how long, how many keys and users."""

    requests: int
    start: float = T0
    span_s: float = 86_400.0
    keys: int = 20
    users: int = 500
    seed: int = 1


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def requests(traffic: Traffic) -> Iterator[tuple[str, list[Event]]]:
    """`(request id, events)` for each request, in arrival order."""
    rng = random.Random(traffic.seed)
    sessions: dict[int, list[dict[str, str]]] = {}
    step = traffic.span_s / max(1, traffic.requests)
    for n in range(traffic.requests):
        ts = traffic.start + n * step
        model = MODELS[n % 7 % len(MODELS)]
        headers = {
            "content-type": "application/json",
            "x-api-key": f"sk-ant-key-{n % traffic.keys}",
            "traceparent": f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01",
        }
        messages: list[dict[str, str]]
        session: int | None = None
        if n % 3 == 0:  # a Claude Code session: a growing history under one session header
            session = rng.randrange(max(1, traffic.requests // 30))
            history = sessions.setdefault(session, [])
            history.append({"role": "user", "content": _sentence(rng, 8)})
            messages = list(history[-12:])
            headers["x-claude-code-session-id"] = f"session-{session}"
        else:
            messages = [{"role": "user", "content": _sentence(rng, 8)}]
        stream = n % 2 == 0
        body = {
            "model": model,
            "max_tokens": 256,
            "stream": stream,
            "metadata": {"user_id": f"user-{rng.randrange(traffic.users)}"},
            "messages": messages,
        }
        worker = WORKERS[rng.randrange(len(WORKERS))]
        events: list[Event] = [
            Received(method="POST", path="/v1/messages", headers=headers, body=orjson.dumps(body).decode(), ts=ts),
            Validated(model=model, stream=stream, t=0.0002),
            Routed(backend="http", worker=worker, model=model, policy="round_robin", t=0.0004),
        ]
        reply = _sentence(rng, 12)
        ttft = 0.02 + rng.random() * 0.3
        duration = ttft + rng.random() * 2.0
        roll = rng.random()
        if roll < 0.03:
            events += [
                Error(
                    stage="upstream",
                    status=529,
                    error_type="overloaded_error",
                    message="capacity exhausted, retry later",
                    t=ttft,
                ),
                Completed(status=529, duration_ms=ttft * 1000, t=ttft),
            ]
        elif stream:
            cut = roll < 0.05
            events += [
                Block(event={"type": "message_start", "message": {"usage": {"input_tokens": 40}}}, t=ttft),
                Block(event={"type": "content_block_delta", "index": 0, "delta": {"text": reply}}, t=ttft + 0.01),
            ]
            if not cut:
                events += [
                    Block(event={"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, t=duration),
                    Block(event={"type": "message_stop"}, t=duration),
                ]
            events.append(
                Completed(
                    status=200,
                    duration_ms=duration * 1000,
                    stop_reason=None if cut else "end_turn",
                    usage={"input_tokens": 40, "output_tokens": 30},
                    disconnected=cut,
                    t=duration,
                )
            )
        else:
            message = {"type": "message", "content": [{"type": "text", "text": reply}], "stop_reason": "end_turn"}
            events += [
                Upstream(part="head", status=200, headers={"content-type": "application/json"}, t=ttft),
                Upstream(part="body", data=orjson.dumps(message).decode(), t=duration),
                Completed(
                    status=200,
                    duration_ms=duration * 1000,
                    stop_reason="end_turn",
                    usage={"input_tokens": 40, "output_tokens": 30},
                    t=duration,
                ),
            ]
        if session is not None:  # the session's next turn resends this answer
            sessions[session].append({"role": "assistant", "content": reply})
        yield f"req_{n:08d}", events


_FLUSH_EVERY = 16384  # events: a quarter of the queue


async def build(path: str | Path, traffic: Traffic, prices: PriceTable | None = None) -> int:
    """Write `traffic` to a journal at `path` through the writer (pricing its requests by
    `prices`, if given); returns the events written."""
    writer = JournalWriter(path, queue_size=65536, max_batch=8192, prices=prices)
    await writer.start()
    try:
        appended = 0
        for request_id, events in requests(traffic):
            for seq, event in enumerate(events, 1):
                await writer.append(request_id, seq, event)
            appended += len(events)
            if appended >= _FLUSH_EVERY:
                # A bulk load waits for its commits: a gateway's writer drops what it cannot
                # hold while a commit runs long, and a slow commit must not cost the fixture events.
                await writer.flush()
                appended = 0
        await writer.flush()
    finally:
        await writer.close()
    return writer.stats["events_written"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.build_journal", description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--span", type=float, default=86_400.0, help="seconds the arrivals spread over")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--price-table", help="price the requests by this table (the gateway's --price-table)")
    args = parser.parse_args(argv)
    prices = load(Path(args.price_table)) if args.price_table else None
    started = time.monotonic()
    written = asyncio.run(build(args.path, Traffic(args.requests, span_s=args.span, seed=args.seed), prices))
    print(f"{args.requests} requests, {written} events in {time.monotonic() - started:.1f}s -> {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
