"""A request's stages as a waterfall: what happened when, and for how long, from its events.

`stages(raw)` reads the stored events (`(seq, kind, t, data)`, `t` in seconds since arrival)
and gives one `Stage` per span, in the order they began, the way a trace viewer lays out
spans: the request itself, admission gates, validation, each routing attempt and its time at
the worker, render and tokenize (gRPC/ZMQ), the engine up to the first token and its
generation after it (or the upstream's head and body on a relay), each content block from its
start to its stop, errors as instants, and the completion. Pure: the journal's own data in,
plain values out; `journal.otlp` exports the coarser spans of the same events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RawEvent = tuple[int, str, float, dict[str, Any]]


@dataclass(frozen=True)
class Stage:
    """One span of the request: `start_ms`/`end_ms` since arrival; `depth` 0 is the request,
    1 a stage of it, 2 a part of a stage (a content block)."""

    name: str
    start_ms: float
    end_ms: float
    detail: str = ""
    depth: int = 1

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "start_ms": round(self.start_ms, 3),
            "duration_ms": round(self.duration_ms, 3),
            "detail": self.detail,
            "depth": self.depth,
        }


def stages(raw: list[RawEvent]) -> list[Stage]:
    """The waterfall of one request's events (see the module docstring)."""
    if not raw:
        return []
    ms = [t * 1000.0 for _, _, t, _ in raw]
    end = max(ms)
    completed = next((data for _, kind, _, data in raw if kind == "completed"), None)
    if completed is not None and isinstance(completed.get("duration_ms"), int | float):
        end = max(end, float(completed["duration_ms"]))
    out: list[Stage] = []
    checked: float | None = None  # validated or rejected
    attempts: list[tuple[float, dict[str, Any]]] = []
    rendered: tuple[float, dict[str, Any]] | None = None
    tokens: list[tuple[float, dict[str, Any]]] = []
    head: float | None = None
    body_end: float | None = None
    blocks: dict[int, tuple[float, str]] = {}
    last_output = 0.0
    for (_, kind, _, data), t in zip(raw, ms, strict=True):
        if kind == "admission":
            waited = float(data.get("queued_ms") or 0.0)
            out.append(Stage(f"admission {data.get('gate', '')}".strip(), max(0.0, t - waited), t,
                             str(data.get("decision") or "")))  # fmt: skip
        elif kind in ("validated", "rejected") and checked is None:
            checked = t
            out.append(Stage("validate", 0.0, t, "rejected" if kind == "rejected" else ""))
        elif kind == "routed":
            attempts.append((t, data))
        elif kind == "rendered" and rendered is None:
            rendered = (t, data)
        elif kind == "tokens":
            tokens.append((t, data))
            last_output = t
        elif kind == "upstream" and not str(data.get("part", "")).startswith("prefill:"):
            if data.get("part") == "head" and head is None:
                head = t
            elif data.get("part") in ("chunk", "body"):
                body_end = t
            last_output = t
        elif kind == "block":
            event = data.get("event") or {}
            index = event.get("index")
            if event.get("type") == "content_block_start" and isinstance(index, int):
                block = event.get("content_block") or {}
                label = str(block.get("type") or "block")
                if block.get("name"):
                    label += f" {block['name']}"
                blocks[index] = (t, label)
            elif event.get("type") == "content_block_stop" and index in blocks:
                began, label = blocks.pop(index)
                out.append(Stage(f"block {index}", began, t, label, depth=2))
            last_output = t
        elif kind == "error":
            code = data.get("code") or data.get("error_type") or ""
            out.append(Stage(f"error ({data.get('stage', '')})", t, t, f"{data.get('status', '')} {code}".strip()))
    for began, label in blocks.values():  # a block the stream never closed
        out.append(Stage(f"block {len(out)}", began, end, f"{label} (not stopped)", depth=2))
    previous = checked if checked is not None else 0.0
    for n, (t, data) in enumerate(attempts):
        worker = f"{data.get('backend', '')} {data.get('worker') or ''}".strip()
        out.append(Stage(f"route (attempt {data.get('attempt', n + 1)})", previous, t, str(data.get("policy") or "")))
        until = attempts[n + 1][0] if n + 1 < len(attempts) else end
        out.append(Stage(f"attempt {data.get('attempt', n + 1)}", t, until, worker))
        previous = until
    routed = attempts[-1][0] if attempts else (checked or 0.0)
    engine_from = routed
    if rendered is not None:
        t, data = rendered
        out.append(Stage("render + tokenize", routed, t, f"{data.get('prompt_tokens', '?')} prompt tokens"))
        engine_from = t
    if tokens:
        first = tokens[0][0]
        out.append(Stage("engine: to first token", engine_from, first))
        out.append(Stage("first token", first, first))
        generated = tokens[-1][1].get("completion_tokens")
        detail = f"{len(tokens)} chunks" + (f", {generated} tokens" if generated is not None else "")
        out.append(Stage("engine: generation", first, tokens[-1][0], detail))
    if head is not None:
        out.append(Stage("upstream: to head", routed, head))
        if body_end is not None:
            out.append(Stage("upstream: body", head, body_end))
    if completed is not None:
        status = completed.get("status")
        stop = completed.get("stop_reason")
        detail = " ".join(str(x) for x in (status, stop) if x is not None)
        out.append(Stage("completion", max(last_output, routed), end, detail))
    out.append(Stage("request", 0.0, end, _request_detail(raw), depth=0))
    out.sort(key=lambda s: (s.depth != 0, s.start_ms, s.depth, -s.duration_ms))
    return out


def _request_detail(raw: list[RawEvent]) -> str:
    received = next((data for _, kind, _, data in raw if kind == "received"), {})
    return f"{received.get('method', '')} {received.get('path', '')}".strip()
