"""The answer as the client finally saw it, and the waterfall of a request, for `show` and the inspector.

`assemble(events)` rebuilds the response the client received (`smg.projection.reconstruct`,
the code the live server runs) and folds it as a client SDK does (`replay.diff.as_outcome`):
the content blocks with their text, thinking and tool input joined from the deltas, the stop
reason and the usage; or the error the client got. `answer_view` and `waterfall_view` render it
and `journal.waterfall.stages` with rich, for the terminal.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from journal.events import Error, Event, Rejected
from journal.waterfall import Stage
from replay.diff import as_outcome
from smg.projection import reconstruct

_BAR_WIDTH = 48


def assemble(events: list[Event]) -> dict[str, Any]:
    """`{status, streamed, model, content, stop_reason, stop_sequence, usage, error}`: the
    blocks of the client's answer (`content`, as a non-streaming response would hold them),
    or its `error` (`type`, `code`, `message`)."""
    response = reconstruct(events)
    outcome = as_outcome(response)
    message = outcome.message or {}
    error: dict[str, Any] | None = None
    if outcome.error_type is not None or (response.status or 0) >= 400:
        failure = next((e for e in reversed(events) if isinstance(e, Error | Rejected)), None)
        error = {
            "type": outcome.error_type or (failure.error_type if failure else None),
            "code": outcome.error_code or (failure.code if failure else None),
            "message": failure.message if failure else None,
        }
    return {
        "status": response.status,
        "streamed": response.streamed,
        "model": message.get("model"),
        "content": list(message.get("content") or []),
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
        "usage": message.get("usage"),
        "error": error,
    }


def answer_view(answer: dict[str, Any]) -> RenderableType:
    """The assembled answer: one section per block, then how it ended."""
    parts: list[RenderableType] = []
    if answer["status"] is None:
        return Text("nothing was sent (no status in the recorded events)", style="yellow")
    how = "streamed" if answer["streamed"] else "buffered"
    parts.append(Text(f"HTTP {answer['status']} ({how})  model {answer['model'] or '-'}", style="bold"))
    for i, block in enumerate(answer["content"]):
        kind = str(block.get("type"))
        title = Text(f"[{i}] {kind}", style="bold cyan")
        if block.get("name"):
            title.append(f" {block['name']}", style="bold")
        if block.get("id"):
            title.append(f"  {block['id']}", style="dim")
        parts.append(title)
        if "text" in block:
            parts.append(Text(str(block["text"])))
        if "thinking" in block:
            parts.append(Text(str(block["thinking"]), style="italic dim"))
        if "input" in block:
            parts.append(Text(json.dumps(block["input"], indent=2, ensure_ascii=False)))
        if "data" in block:
            parts.append(Text("(redacted thinking)", style="dim"))
    error = answer.get("error")
    if error:
        parts.append(
            Text(f"error {error.get('type') or ''} {error.get('code') or ''}: {error.get('message') or ''}", "bold red")
        )
    end = []
    if answer["stop_reason"] is not None:
        end.append(f"stop_reason {answer['stop_reason']}")
    if answer["stop_sequence"] is not None:
        end.append(f"stop_sequence {answer['stop_sequence']!r}")
    if answer["usage"]:
        end.append("usage " + " ".join(f"{k}={v}" for k, v in answer["usage"].items() if v is not None))
    if end:
        parts.append(Text("  ".join(end), style="green"))
    return Group(*parts)


def waterfall_view(stages: list[Stage], width: int = _BAR_WIDTH) -> RenderableType:
    """The stages as a table with a bar each, placed on the request's time axis."""
    if not stages:
        return Text("no events", style="yellow")
    total = max(s.end_ms for s in stages) or 1.0
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("stage", no_wrap=True)
    table.add_column("start", justify="right", no_wrap=True)
    table.add_column("took", justify="right", no_wrap=True)
    table.add_column(f"0 … {_ms(total)}", no_wrap=True)
    table.add_column("", overflow="fold")
    for stage in stages:
        begin = round(stage.start_ms / total * width)
        length = max(1, round(stage.duration_ms / total * width))
        begin = min(begin, width - length)
        style = "bold red" if stage.name.startswith("error") else ("bold" if stage.depth == 0 else "cyan")
        glyph = "│" if stage.duration_ms == 0 else "█"
        bar = Text(" " * begin + glyph * length + " " * (width - begin - length), style=style)
        table.add_row(
            Text("  " * stage.depth + stage.name, style="bold" if stage.depth == 0 else ""),
            _ms(stage.start_ms),
            _ms(stage.duration_ms),
            bar,
            Text(stage.detail, style="dim"),
        )
    return table


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value >= 10 else f"{value:.2f} ms"
