"""`smg journal ls` and `smg journal show`: read a journal from the terminal.

Both open the file read-only, so they work next to a running gateway.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console, Group
from rich.json import JSON
from rich.markup import escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from journal.events import Event, event_from_dict, event_kinds
from journal.reader import JournalError, JournalReader
from journal.schema import DEFAULT_PATH, ENV_VAR
from journal.summary import describe
from smg.projection import reconstruct

journal_app = typer.Typer(
    help="Inspect the request journal (read-only; safe while the gateway runs).",
    no_args_is_help=True,
)

JournalOpt = Annotated[
    str,
    typer.Option(
        "--journal",
        "-j",
        envvar=ENV_VAR,
        help=f"Journal file (default: ${ENV_VAR}, else ./{DEFAULT_PATH}).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _open(path: str) -> JournalReader:
    try:
        return JournalReader(path)
    except JournalError as exc:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(1) from exc


def _echo_json(value: Any) -> None:
    typer.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode())


@journal_app.command("ls")
def ls(
    journal: JournalOpt = DEFAULT_PATH,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many requests.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List the most recent requests, newest first."""
    with _open(journal) as reader:
        rows = reader.list_requests(limit=limit)
    if as_json:
        _echo_json(rows)
        return
    console = Console()
    cells = [
        {
            "id": row["id"],
            "time": _clock(row["ts"]),
            "request": f"{row['method'] or ''} {row['path'] or ''}".strip(),
            "model": row["model"] or "",
            "backend": row["backend"] or "",
            "worker": row["worker"] or "",
            "status": _status(row),
            "code": row["error_code"] or "",
            "stop": row["stop_reason"] or "",
            "in/out": _tokens(row),
            "ttfe": _ms(row["ttfe_ms"]),
            "duration": _ms(row["duration_ms"]),
        }
        for row in rows
    ]
    console.print(_fit_table(console, f"{len(rows)} requests ({journal})", cells))


@journal_app.command("show")
def show(
    request_id: Annotated[str, typer.Argument(help="Request id, or a unique prefix of one.")],
    journal: JournalOpt = DEFAULT_PATH,
    as_json: JsonOpt = False,
) -> None:
    """One request: its event timeline, the request, and the response the client got."""
    with _open(journal) as reader:
        try:
            row = reader.get_request(request_id)
        except JournalError as exc:
            Console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(1) from exc
        if row is None:
            missing = f"no request {request_id!r} in {journal}"
            Console(stderr=True).print(f"[red]error:[/] {escape(missing)}")
            raise typer.Exit(1)
        raw = reader.raw_events(row["id"])
    known = set(event_kinds())
    events = [event_from_dict(kind, data, t) for _, kind, t, data in raw if kind in known]
    response, why = _reconstruct(events)

    if as_json:
        _echo_json(
            {
                "request": row,
                "events": [{"seq": seq, "kind": kind, "t": t, "data": data} for seq, kind, t, data in raw],
                "response": None
                if response is None
                else {
                    "status": response.status,
                    "headers": dict(response.headers),
                    "body": response.body.decode("utf-8", "replace"),
                },
                "response_unavailable": why,
            }
        )
        return

    console = Console()
    console.print(
        Panel(
            Text.assemble(
                (row["id"], "bold"),
                f"  {_clock(row['ts'], full=True)}  status {_status(row)}",
                f"  model {row['model'] or '-'}  backend {row['backend'] or '-'}",
                f"  worker {row['worker'] or '-'}",
                *([f"  replay of {row['replay_of']}"] if row["replay_of"] else []),
            ),
            title="request",
            title_align="left",
        )
    )
    console.print(_timeline(raw))
    received = next((e for e in events if e.kind == "received"), None)
    if received is not None:
        console.print(_request_view(received))
    if response is None:
        console.print(f"[yellow]response view unavailable:[/] {escape(why or '')}")
    else:
        console.print(_response_view(response.status, dict(response.headers), response.body))


# -- pieces ------------------------------------------------------------------------------

# ls columns, most important first; on a narrow terminal the tail is dropped, not squeezed.
_LS_COLUMNS = (
    "id", "status", "request", "model", "duration", "code", "stop", "in/out", "ttfe",
    "time", "backend", "worker",
)  # fmt: skip
_RIGHT = frozenset({"status", "in/out", "ttfe", "duration"})
_ORDER = (
    "id", "time", "request", "model", "backend", "worker", "status", "code", "stop",
    "in/out", "ttfe", "duration",
)  # fmt: skip


def _fit_table(console: Console, title: str, cells: list[dict[str, str]]) -> Table:
    keep = len(_LS_COLUMNS)
    while True:
        shown = set(_LS_COLUMNS[:keep])
        table = Table(title=title, title_justify="left")
        for name in _ORDER:
            if name in shown:
                table.add_column(name, no_wrap=True, justify="right" if name in _RIGHT else "left")
        for row in cells:
            table.add_row(*(row[name] for name in _ORDER if name in shown))
        width = Measurement.get(console, console.options.update_width(10_000), table).maximum
        if width <= console.width or keep <= 3:
            return table
        keep -= 1


def _reconstruct(events: list[Event]) -> tuple[Any, str | None]:
    try:
        return reconstruct(events), None
    except Exception as exc:  # a projection bug must not hide the timeline
        return None, f"reconstruct failed: {type(exc).__name__}: {exc}"


def _timeline(raw: list[tuple[int, str, float, dict[str, Any]]]) -> Table:
    table = Table(title="timeline", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("seq", justify="right", style="dim")
    table.add_column("t (ms)", justify="right")
    table.add_column("kind", style="bold")
    table.add_column("event", overflow="fold")
    known = set(event_kinds())
    for seq, kind, t, data in raw:
        if kind in known:
            text = describe(event_from_dict(kind, data, t))
        else:
            text = f"(unknown kind) {json.dumps(data)[:80]}"
        table.add_row(str(seq), f"{t * 1000:.1f}", kind, Text(text))
    return table


def _request_view(received: Any) -> Panel:
    headers = Table.grid(padding=(0, 1))
    for name, value in received.headers.items():  # stored redacted
        headers.add_row(Text(f"{name}:", style="cyan"), Text(value))
    query = f"?{received.query}" if received.query else ""
    parts: list[Any] = [Text(f"{received.method} {received.path}{query}", style="bold"), headers]
    if received.body:
        parts.append(_body(received.body, "application/json"))
    return Panel(Group(*parts), title="request as received", title_align="left")


def _response_view(status: int | None, headers: dict[str, str], body: bytes) -> Panel:
    if status is None:
        return Panel(
            Text("nothing was sent (no status in the recorded events)", style="yellow"),
            title="response as the client received it",
            title_align="left",
        )
    grid = Table.grid(padding=(0, 1))
    for name, value in headers.items():
        grid.add_row(Text(f"{name}:", style="cyan"), Text(value))
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    parts: list[Any] = [Text(f"HTTP {status}", style="bold"), grid]
    if body:
        parts.append(_body(body.decode("utf-8", "replace"), content_type))
    return Panel(Group(*parts), title="response as the client received it", title_align="left")


def _body(text: str, content_type: str) -> Any:
    if "json" in content_type:
        try:
            json.loads(text)
        except ValueError:
            return Text(text)
        return JSON(text)
    return Text(text)


def _clock(ts: float | None, full: bool = False) -> str:
    if not ts:
        return ""
    fmt = "%Y-%m-%d %H:%M:%S" if full else "%m-%d %H:%M:%S"
    return time.strftime(fmt, time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def _status(row: dict[str, Any]) -> str:
    status = row["status"]
    if status is None:
        return "…" if not row["completed"] else "?"
    return str(status)


def _tokens(row: dict[str, Any]) -> str:
    if row["input_tokens"] is None and row["output_tokens"] is None:
        return ""
    return f"{row['input_tokens'] if row['input_tokens'] is not None else '-'}/" + (
        f"{row['output_tokens'] if row['output_tokens'] is not None else '-'}"
    )


def _ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.0f}ms" if value >= 10 else f"{value:.1f}ms"
