"""Rich renderables and table cells for the inspector: pure functions of journal data."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.json import JSON
from rich.table import Table
from rich.text import Text

from journal.events import Block, Completed, Error, Event, Received, Rejected, event_from_dict, event_kinds
from journal.summary import describe
from smg.projection import Reconstructed

# Bodies beyond this are shown as plain, clipped text: pretty-printing megabytes would stall
# the terminal.
MAX_PRETTY = 256 * 1024
MAX_SHOWN = 1024 * 1024

LIST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("time", "time"),
    ("id", "id"),
    ("replica", "replica"),
    ("flags", "≈"),
    ("model", "model"),
    ("backend", "backend"),
    ("tenant", "tenant"),
    ("status", "status"),
    ("code", "code"),
    ("stop", "stop"),
    ("tokens", "in/out"),
    ("ttfe", "ttfe"),
    ("duration", "duration"),
    ("cost", "cost $"),
)
"""(column key, header) of the request list (`replica` only over the fleet journal)."""

COLUMN_PRIORITY: tuple[str, ...] = (
    "status", "id", "flags", "model", "duration", "replica", "time", "code", "stop", "tokens", "ttfe", "tenant",
    "backend", "cost",
)  # fmt: skip
"""The list's columns, most important first: a narrow terminal drops them from the end."""
COLUMN_WIDTHS: dict[str, int] = {
    "time": 18,
    "id": 30,
    "replica": 14,
    "flags": 3,
    "model": 18,
    "backend": 8,
    "tenant": 14,
    "status": 6,
    "code": 16,
    "stop": 10,
    "tokens": 9,
    "ttfe": 8,
    "duration": 9,
    "cost": 9,
}
"""About how wide each column's cells are, for choosing the columns that fit."""


def fitting_columns(width: int, *, replicas: bool = False) -> list[str]:
    """The keys of the columns that fit in `width` cells, by priority, in `LIST_COLUMNS` order;
    `replicas`: the journal is the fleet's, whose rows name their replica."""
    chosen: set[str] = set()
    used = 0
    for key in COLUMN_PRIORITY:
        if key == "replica" and not replicas:
            continue
        need = COLUMN_WIDTHS[key] + 2  # the table's cell padding
        if chosen and used + need > width:
            break
        chosen.add(key)
        used += need
    return [key for key, _ in LIST_COLUMNS if key in chosen]


def flags(row: dict[str, Any]) -> Text:
    """One cell of markers: `~` streamed, `x` cut mid-stream, `h` the client hung up."""
    text = Text()
    if row.get("stream"):
        text.append("~", "cyan")
    if row.get("cut_mid_stream"):
        text.append("x", "bold red")
    elif row.get("hung_up"):
        text.append("h", "yellow")
    return text


class Stamp:
    """A time cell that renders as a clock and sorts by its epoch seconds."""

    __slots__ = ("ts",)

    def __init__(self, ts: float | None) -> None:
        self.ts = float(ts or 0.0)

    def __rich__(self) -> Text:
        return Text(clock(self.ts) if self.ts else "", style="dim")


def list_cells(row: dict[str, Any], keys: list[str] | None = None) -> list[Any]:
    """The request list's cells for one summary row, for the columns `keys` (default: all,
    in `LIST_COLUMNS` order)."""
    cells: dict[str, Callable[[], Any]] = {
        "time": lambda: Stamp(row.get("ts")),
        "id": lambda: _id_text(row),
        "replica": lambda: Text(row.get("replica") or "", style="magenta"),
        "flags": lambda: flags(row),
        "model": lambda: Text(row.get("model") or ""),
        "backend": lambda: Text(row.get("backend") or ""),
        "tenant": lambda: Text(row.get("tenant") or "", style="dim"),
        "status": lambda: status_text(row),
        "code": lambda: Text(row.get("error_code") or "", style="yellow"),
        "stop": lambda: Text(row.get("stop_reason") or ""),
        "tokens": lambda: Text(tokens(row), justify="right"),
        "ttfe": lambda: Text(ms(row.get("ttfe_ms")), justify="right"),
        "duration": lambda: Text(ms(row.get("duration_ms")), justify="right"),
        "cost": lambda: Text(dollars(row.get("cost_usd")), justify="right"),
    }
    return [cells[key]() for key in (keys if keys is not None else [k for k, _ in LIST_COLUMNS])]


def _id_text(row: dict[str, Any]) -> Text:
    """The gateway's id, and the client's when it sent another."""
    text = Text(str(row["id"]))
    client = row.get("client_id")
    if client and client != row["id"]:
        text.append(f" {client}", style="dim")
    return text


def status_text(row: dict[str, Any]) -> Text:
    status = row.get("status")
    if status is None:
        return Text("?" if row.get("completed") else "…", style="dim", justify="right")
    style = "green" if status < 300 else "yellow" if status < 500 else "bold red"
    return Text(str(status), style=style, justify="right")


def header(row: dict[str, Any]) -> Text:
    """The detail view's one-line summary of a request."""
    parts: list[Any] = [
        (str(row["id"]), "bold"),
        *([f"  client id {row['client_id']}"] if row.get("client_id") not in (None, row["id"]) else []),
        f"  {clock(row.get('ts'), full=True)}  ",
        f"{row.get('method') or ''} {row.get('path') or ''}  status ",
        status_text(row),
        f"  model {row.get('model') or '-'}  backend {row.get('backend') or '-'}  worker {row.get('worker') or '-'}",
    ]
    if row.get("stop_reason"):
        parts.append(f"  stop {row['stop_reason']}")
    if tokens(row):
        parts.append(f"  tokens {tokens(row)}")
    if row.get("duration_ms") is not None:
        parts.append(f"  {ms(row['duration_ms'])}")
    for key, label in (("tenant", "tenant"), ("session_id", "session"), ("trace_id", "trace")):
        if row.get(key):
            parts.append(f"  {label} {row[key]}")
    if row.get("cut_mid_stream"):
        parts.append(("  CUT MID-STREAM", "bold red"))
    elif row.get("hung_up"):
        parts.append(("  CLIENT HUNG UP", "yellow"))
    if row.get("replay_of"):
        parts.append((f"  replay of {row['replay_of']}", "magenta"))
    if row.get("bodies") not in (None, "full"):
        parts.append((f"  bodies {row['bodies']}", "yellow"))
    return Text.assemble(*parts)


def timeline_rows(raw: list[tuple[int, str, float, dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """(seq, t ms, +Δ ms, kind, description) per stored event, unknown kinds included."""
    known = set(event_kinds())
    rows: list[tuple[Any, ...]] = []
    previous = 0.0
    for seq, kind, t, data in raw:
        if kind in known:
            text = describe(event_from_dict(kind, data, t))
        else:
            text = f"(unknown kind) {json.dumps(data)[:80]}"
        rows.append(
            (
                Text(str(seq), style="dim", justify="right"),
                Text(f"{t * 1000:.1f}", justify="right"),
                Text(f"+{(t - previous) * 1000:.1f}", style="dim", justify="right"),
                Text(kind, style=_KIND_STYLE.get(kind, "bold")),
                Text(text),
            )
        )
        previous = t
    return rows


_KIND_STYLE = {"error": "bold red", "rejected": "bold red", "completed": "bold green", "tokens": "cyan"}


def request_view(received: Received | None) -> RenderableType:
    if received is None:
        return Text("no `received` event in the journal for this request", style="yellow")
    query = f"?{received.query}" if received.query else ""
    parts: list[RenderableType] = [Text(f"{received.method} {received.path}{query}", style="bold")]
    parts.append(_headers(received.headers))  # stored redacted
    if received.client or received.tenant:
        parts.append(Text(f"client {received.client or '-'}  tenant {received.tenant or '-'}", style="dim"))
    parts.append(Text(""))
    parts.append(body_view(received.body or "", "application/json") if received.body else Text("(no body)", "dim"))
    return Group(*parts)


def response_view(response: Reconstructed | None, why: str | None = None) -> RenderableType:
    if response is None:
        return Text(f"response view unavailable: {why or 'unknown'}", style="yellow")
    if response.status is None:
        return Text("nothing was sent (no status in the recorded events)", style="yellow")
    kind = "SSE stream" if response.streamed else "body"
    parts: list[RenderableType] = [
        Text(f"HTTP {response.status}  ({kind}, {len(response.body)} bytes)", style="bold"),
        _headers(response.headers),
        Text(""),
    ]
    if response.body:
        content_type = next((v for k, v in response.headers.items() if k.lower() == "content-type"), "")
        parts.append(body_view(response.body.decode("utf-8", "replace"), content_type))
    return Group(*parts)


def body_view(text: str, content_type: str) -> RenderableType:
    if len(text) > MAX_PRETTY or "json" not in content_type:
        return _clipped(text)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return _clipped(text)
    try:  # a lone surrogate escape decodes to a character no terminal prints: keep it escaped
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return JSON(text, indent=2, ensure_ascii=True)
    return JSON(text, indent=2)


def _clipped(text: str) -> Text:
    if len(text) <= MAX_SHOWN:
        return Text(text)
    return Text.assemble(text[:MAX_SHOWN], (f"\n… {len(text) - MAX_SHOWN} more characters", "yellow"))


def _headers(headers: dict[str, str]) -> Table:
    grid = Table.grid(padding=(0, 1))
    for name, value in headers.items():
        grid.add_row(Text(f"{name}:", style="cyan"), Text(value))
    return grid


def token_row(seq: int, event: Any, text: str | None) -> tuple[Any, ...]:
    """(seq, t ms, ids, decoded text, note) for one `tokens` event; `text` None when no tokenizer."""
    notes = []
    if event.finish_reason:
        notes.append(f"finish={event.finish_reason}")
    if event.matched_stop is not None:
        notes.append(f"stop={event.matched_stop!r}")
    return (
        Text(str(seq), style="dim", justify="right"),
        Text(f"{event.t * 1000:.1f}", justify="right"),
        Text(" ".join(str(i) for i in event.ids), style="cyan"),
        Text(visible(text)) if text is not None else Text("—", style="dim"),
        Text(" ".join(notes), style="yellow"),
    )


def visible(text: str) -> str:
    """Decoded text with whitespace made visible (a token of one newline must show)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def errors_view(errors: list[tuple[int, Error | Rejected]], events: list[Event]) -> RenderableType:
    disconnected = any(e.disconnected for e in events if isinstance(e, Completed))
    sse_errors = [e.event.get("error") or {} for e in events if isinstance(e, Block) and e.event.get("type") == "error"]
    if not errors and not sse_errors and not disconnected:
        return Text("no errors", style="green")
    table = Table(show_edge=False, pad_edge=False, expand=True)
    for name in ("seq", "t (ms)", "kind", "stage", "status", "type", "code", "message"):
        table.add_column(name, overflow="fold", no_wrap=name != "message")
    for seq, event in errors:
        stage = event.stage if isinstance(event, Error) else "validation"
        table.add_row(
            str(seq),
            f"{event.t * 1000:.1f}",
            Text(event.kind, style="bold red"),
            stage,
            str(event.status),
            event.error_type,
            event.code or "",
            Text(event.message),
        )
    for error in sse_errors:
        table.add_row("", "", Text("sse error", style="bold red"), "stream", "", str(error.get("type", "")), "",
                      Text(str(error.get("message", ""))))  # fmt: skip
    parts: list[RenderableType] = [table]
    if disconnected:
        parts.append(Text("the client disconnected before the response finished", style="yellow"))
    return Group(*parts)


def clock(ts: float | None, full: bool = False) -> str:
    if not ts:
        return ""
    fmt = "%Y-%m-%d %H:%M:%S" if full else "%m-%d %H:%M:%S"
    return time.strftime(fmt, time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def tokens(row: dict[str, Any]) -> str:
    inp, out = row.get("input_tokens"), row.get("output_tokens")
    if inp is None and out is None:
        return ""
    return f"{inp if inp is not None else '-'}/{out if out is not None else '-'}"


def ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.0f}ms" if value >= 10 else f"{value:.1f}ms"


def thread_view(turns: list[Any], current: str) -> RenderableType:
    """A conversation (`journal.threads.Turn`s, oldest first), the current request in bold."""
    if not turns:
        return Text("this request belongs to no conversation (no messages)", style="dim")
    table = Table(show_edge=False, pad_edge=False)
    for name in ("#", "id", "time", "status", "model", "in/out", "added"):
        table.add_column(name, no_wrap=name != "added", overflow="fold")
    for n, turn in enumerate(turns, 1):
        row = turn.row
        table.add_row(
            str(n),
            Text(str(row["id"]), style="bold reverse" if row["id"] == current else ""),
            clock(row.get("ts")),
            status_text(row),
            row.get("model") or "",
            tokens(row),
            Text(turn.summary(), style="yellow" if turn.rewritten else ""),
        )
    return table


def dollars(cost: Any) -> str:
    """A cost cell: dollars to four places (a cent is 0.0100), empty for a request with no price."""
    return f"{cost:.4f}" if isinstance(cost, int | float) else ""


def stats_view(rows: list[dict[str, Any]], by: str) -> RenderableType:
    """`journal.groups.compute` rows (per group, no buckets) as a table."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column(by, no_wrap=True)
    for name in ("requests", "errors", "err %", "hung up", "p50 ms", "p99 ms", "ttft p50", "ttft p99", "out", "cost $"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        lat, ttft = row["latency_ms"], row["ttft_ms"]
        table.add_row(
            str(row["group"] if row["group"] is not None else "-"),
            str(row["requests"]),
            str(row["errors"]),
            f"{row['error_rate']:.1%}",
            str(row["hung_up"]),
            ms(lat["p50"]),
            ms(lat["p99"]),
            ms(ttft["p50"]),
            ms(ttft["p99"]),
            str(row["tokens_out"]),
            dollars(row.get("cost_usd")),
        )
    return table
