"""`smg journal …`: read a journal from the terminal.

`ls` (a filtered, sorted table of requests), `show` (one request: timeline, request, response),
`tail` (requests as they complete), `export` (one request as curl, JSON or HAR) and `stats`
(counts, errors, latency percentiles, token throughput). Every command opens the file
read-only, so it works next to a running gateway. The pure parts live in `journal.export`,
`journal.stats` and `journal.follow`; this module parses flags and renders.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import time
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console, Group
from rich.json import JSON
from rich.markup import escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from journal import export as exporting
from journal import stats as statistics
from journal.events import Counted, Event, Received, Rendered, Tokens, event_from_dict, event_kinds
from journal.follow import Follower
from journal.query import QueryError, compile_query
from journal.reader import JournalError, JournalNotFound, JournalReader
from journal.schema import DEFAULT_PATH, ENV_VAR, REQUEST_COLUMNS
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
QueryArg = Annotated[
    str,
    typer.Argument(help="Which requests, in the journal query language (default: all).", show_default=False),
]


def _fail(message: str, code: int = 1) -> NoReturn:
    Console(stderr=True).print(f"[red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def _open(path: str) -> JournalReader:
    try:
        return JournalReader(path)
    except JournalError as exc:
        _fail(str(exc))


def _compile(query: str, reader: JournalReader | None = None) -> tuple[str, list[Any]]:
    """The query as SQL (over the reader's file when given); a bad query is a usage error (exit 2)."""
    try:
        return reader.compile(query) if reader is not None else compile_query(query)
    except QueryError as exc:
        _fail(f"bad query {query!r}: {exc}", code=2)


def _connection(reader: JournalReader) -> sqlite3.Connection:
    """The reader's read-only connection, for the SQL of `journal.stats` and `journal.follow`."""
    return reader.connection


def _echo_json(value: Any) -> None:
    typer.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode())


@journal_app.command("ls")
def ls(
    query: QueryArg = "",
    journal: JournalOpt = DEFAULT_PATH,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many requests.")] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Skip this many first.")] = 0,
    sort: Annotated[
        str, typer.Option("--sort", "-s", help=f"Sort by this summary column: {', '.join(REQUEST_COLUMNS)}.")
    ] = "ts",
    asc: Annotated[bool, typer.Option("--asc", help="Smallest first (default: largest, i.e. newest, first).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List requests matching QUERY, newest first (or by --sort)."""
    if sort not in REQUEST_COLUMNS:
        _fail(f"--sort: no column {sort!r}; one of {', '.join(REQUEST_COLUMNS)}", code=2)
    with _open(journal) as reader:
        try:
            rows, total = reader.page(limit, query=query, offset=offset, order=sort, descending=not asc)
        except QueryError as exc:
            _fail(f"bad query {query!r}: {exc}", code=2)
    if as_json:
        _echo_json(rows)
        return
    console = Console()
    cells = [_cells(row) for row in rows]
    shown = f"{len(rows)} of {total}" if total != len(rows) else str(total)
    order = f"{sort}, {'smallest' if asc else 'largest'} first" if sort != "ts" else "oldest first" if asc else ""
    title = f"{shown} requests{f' matching {query!r}' if query else ''}{f' by {order}' if order else ''} ({journal})"
    console.print(_fit_table(console, title, cells))


def _cells(row: dict[str, Any]) -> dict[str, str]:
    return {
        "id": row["id"],
        "client id": row["client_id"] if row["client_id"] not in (None, row["id"]) else "",
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


@journal_app.command("show")
def show(
    request_id: Annotated[
        str, typer.Argument(help="Request id (the gateway's, a unique prefix of it, or a client's unique id).")
    ],
    journal: JournalOpt = DEFAULT_PATH,
    as_json: JsonOpt = False,
) -> None:
    """One request: its event timeline, the request, and the response the client got."""
    row, raw, events = _load(journal, request_id)
    response, why = _reconstruct(events)

    if as_json:
        _echo_json(exporting.as_json(row, raw, response, response_error=why))
        return

    console = Console()
    console.print(
        Panel(
            Text.assemble(
                (row["id"], "bold"),
                *([f"  client id {row['client_id']}"] if row["client_id"] not in (None, row["id"]) else []),
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


@journal_app.command("tail")
def tail(
    query: QueryArg = "",
    journal: JournalOpt = DEFAULT_PATH,
    interval: Annotated[float, typer.Option("--interval", min=0.01, help="Seconds between looks.")] = 0.5,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON summary per line (JSON Lines).")] = False,
    max_count: Annotated[
        int | None, typer.Option("--max", min=1, help="Stop after this many requests.", show_default=False)
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Stop after this many seconds.", show_default=False)
    ] = None,
) -> None:
    """Follow the journal: print each request matching QUERY as it completes (Ctrl-C stops)."""
    _compile(query)  # a bad query fails before waiting for the file
    deadline = None if timeout is None else time.monotonic() + timeout
    err = Console(stderr=True)
    out = Console(highlight=False)
    try:
        reader = _wait_for(journal, deadline, err)
        if reader is None:
            return
        with reader:
            where, params = _compile(query, reader)
            follower = Follower(_connection(reader), where, params)
            err.print(f"[dim]following {escape(journal)}{escape(f' for {query!r}') if query else ''}…[/]")
            shown = 0
            while True:
                for request_id in follower.poll():
                    row = reader.get_request(request_id)
                    if row is None:  # pruned between the two reads
                        continue
                    if as_json:
                        typer.echo(orjson.dumps(row, default=str).decode())
                    else:
                        out.print(_tail_line(row), soft_wrap=True)
                    shown += 1
                    if max_count is not None and shown >= max_count:
                        return
                if not _sleep(interval, deadline):
                    return
    except KeyboardInterrupt:
        return


def _wait_for(path: str, deadline: float | None, err: Console) -> JournalReader | None:
    """The journal, once it exists (a tail may start before the gateway); None on timeout."""
    said = False
    while True:
        try:
            return JournalReader(path)
        except JournalNotFound:
            if not said:
                err.print(f"[dim]waiting for {escape(path)} to appear…[/]")
                said = True
        except JournalError as exc:
            _fail(str(exc))
        if not _sleep(0.5, deadline):
            return None


def _sleep(seconds: float, deadline: float | None) -> bool:
    """Sleep up to `seconds`, never past `deadline`; False once the deadline has passed."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        seconds = min(seconds, left)
    time.sleep(seconds)
    return True


def _tail_line(row: dict[str, Any]) -> Text:
    status = row["status"]
    style = "green" if status and status < 400 else "yellow" if status and status < 500 else "red"
    cells = _cells(row)
    line = Text.assemble(
        (f"{cells['time']:<18} ", "dim"),
        (f"{cells['status']:>3} ", style),
        f"{cells['request']} ",
        (f"{cells['model'] or '-'} ", "cyan"),
        f"{cells['duration']:>8} ",
    )
    extra = [f"{k}={cells[k]}" for k in ("backend", "stop", "code", "in/out") if cells[k]]
    line.append(" ".join(extra) + " ", "dim")
    line.append(row["id"], "bold")
    if row["client_id"] not in (None, row["id"]):
        line.append(f" ({row['client_id']})")
    return line


class ExportFormat(enum.StrEnum):
    curl = "curl"
    json = "json"
    har = "har"


@journal_app.command("export")
def export(
    request_id: Annotated[
        str, typer.Argument(help="Request id (the gateway's, a unique prefix of it, or a client's unique id).")
    ],
    journal: JournalOpt = DEFAULT_PATH,
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--as",
            help="curl: a command that sends the request again (keys from $SMG_API_KEY / $ANTHROPIC_API_KEY); "
            "json: summary, events and response; har: an HTTP Archive 1.2 log.",
        ),
    ] = ExportFormat.json,
    url: Annotated[
        str, typer.Option("--url", help="The gateway's base URL, for curl and HAR.")
    ] = exporting.DEFAULT_BASE_URL,
) -> None:
    """Print one request as a curl command, a JSON document or a HAR log."""
    row, raw, events = _load(journal, request_id)
    if row.get("bodies") not in (None, "full"):
        Console(stderr=True).print(
            f"[yellow]warning:[/] {escape(row['id'])} was journaled with bodies {escape(str(row['bodies']))}:"
            " its request and response content are not the ones sent"
        )
    received = next((e for e in events if isinstance(e, Received)), None)
    if fmt is ExportFormat.json:
        response, why = _reconstruct(events)
        _echo_json(exporting.as_json(row, raw, response, response_error=why))
    elif received is None:
        _fail(f"request {row['id']} has no `received` event to export")
    elif fmt is ExportFormat.curl:
        typer.echo(exporting.as_curl(received, url))
    else:
        response, _ = _reconstruct(events)
        _echo_json(exporting.as_har(events, response, url, creator_version=_version()))


@journal_app.command("stats")
def stats(
    query: QueryArg = "",
    journal: JournalOpt = DEFAULT_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Counts, error codes, stop reasons, latency percentiles and token throughput of QUERY."""
    _compile(query)
    with _open(journal) as reader:
        where, params = _compile(query, reader)
        numbers = statistics.compute(_connection(reader), where, params)
    if as_json:
        _echo_json(numbers)
        return
    console = Console()
    console.print(_stats_view(numbers, query, journal))


@journal_app.command("prune")
def prune(
    journal: JournalOpt = DEFAULT_PATH,
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Delete requests that arrived longer ago than this (7d, 12h).")
    ] = None,
    max_size: Annotated[
        str | None, typer.Option("--max-size", help="Delete the oldest requests until the data fits (500MB, 2GB).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete whole requests, oldest first, by age and/or size (the one command that writes).

    Safe while the gateway runs: it deletes in small transactions the gateway interleaves
    with its own, and keeps requests that may still be in flight.
    """
    from journal.retention import parse_age, parse_size
    from journal.retention import prune as prune_journal
    from journal.schema import SchemaTooNew

    if older_than is None and max_size is None:
        _fail("say what to prune: --older-than AGE and/or --max-size SIZE", code=2)
    try:
        max_age_s = parse_age(older_than) if older_than is not None else None
        max_bytes = parse_size(max_size) if max_size is not None else None
    except ValueError as exc:
        _fail(str(exc), code=2)
    try:
        result = prune_journal(journal, max_age_s=max_age_s, max_bytes=max_bytes)
    except FileNotFoundError as exc:
        _fail(str(exc))
    except (sqlite3.DatabaseError, SchemaTooNew) as exc:
        _fail(f"{journal} cannot be pruned: {exc}")
    if as_json:
        _echo_json(vars(result))
        return
    typer.echo(
        f"pruned {result.requests_deleted} requests ({result.events_deleted} events) from {journal}:"
        f" {result.bytes_before / 1e6:.1f} MB -> {result.bytes_after / 1e6:.1f} MB of data"
    )


# -- pieces ------------------------------------------------------------------------------


def _load(journal: str, request_id: str) -> tuple[dict[str, Any], list[exporting.RawEvent], list[Event]]:
    """A request's summary row, its events as stored, and the ones this version knows."""
    with _open(journal) as reader:
        try:
            row = reader.get_request(request_id)
        except JournalError as exc:
            _fail(str(exc))
        if row is None:
            _fail(f"no request {request_id!r} in {journal}")
        raw = reader.raw_events(row["id"])
    known = set(event_kinds())
    return row, raw, [event_from_dict(kind, data, t) for _, kind, t, data in raw if kind in known]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("smg-py")
    except PackageNotFoundError:
        return ""


def _stats_view(numbers: dict[str, Any], query: str, journal: str) -> Group:
    n = numbers["requests"]
    span = ""
    if numbers["first_ts"] is not None:
        span = f", {_clock(numbers['first_ts'], full=True)} → {_clock(numbers['last_ts'], full=True)}"
    head = Text.assemble(
        (f"{n} requests", "bold"),
        f"{f' matching {query!r}' if query else ''} in {journal}{span}\n",
        f"completed {numbers['completed']}, in flight {numbers['in_flight']}, errors {numbers['errors']}",
        f" ({numbers['errors'] / n:.1%})" if n else "",
    )
    counts = Table.grid(padding=(0, 3))
    tables = [
        _count_table(title, numbers[key], n)
        for key, title in (
            ("by_status_class", "status"),
            ("by_model", "model"),
            ("by_backend", "backend"),
            ("error_codes", "error code"),
            ("stop_reasons", "stop reason"),
        )
        if numbers[key]
    ]
    if tables:
        counts.add_row(*tables)

    latency = Table(title="latency (ms)", title_justify="left")
    labels = [k for k in numbers["latency_ms"]["duration"] if k.startswith("p")]
    latency.add_column("")
    for name in ("count", *labels, "mean", "max"):
        latency.add_column(name, justify="right")
    for name, dist in (("duration", numbers["latency_ms"]["duration"]), ("first event", numbers["latency_ms"]["ttfe"])):
        latency.add_row(name, str(dist["count"]), *(_num(dist[k]) for k in (*labels, "mean", "max")))

    tok = numbers["tokens"]
    tokens = Text.assemble(
        ("tokens ", "bold"),
        f"input {tok['input']}, output {tok['output']}; output tokens/s {_num(tok['output_per_s'])} overall",
        f", {_num(tok['output_per_s_median'])} median per request ({tok['rated_requests']} requests)",
    )
    return Group(head, counts, latency, tokens)


def _count_table(title: str, counts: dict[Any, int], total: int) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column(no_wrap=True)
    table.add_column(justify="right")
    table.add_column(justify="right", style="dim")
    for value, count in counts.items():
        table.add_row(str(value), str(count), f"{count / total:.0%}" if total else "")
    return table


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


# ls columns, most important first; on a narrow terminal the tail is dropped, not squeezed.
_LS_COLUMNS = (
    "id", "status", "request", "model", "duration", "code", "stop", "in/out", "client id", "ttfe",
    "time", "backend", "worker",
)  # fmt: skip
_RIGHT = frozenset({"status", "in/out", "ttfe", "duration"})
_ORDER = (
    "id", "client id", "time", "request", "model", "backend", "worker", "status", "code", "stop",
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
    generated = 0
    for seq, kind, t, data in raw:
        if kind in known:
            event = event_from_dict(kind, data, t)
            text = Text(describe(event))
            if isinstance(event, Tokens):
                generated += len(event.ids)
                text.append(f"  Σ {generated} ids", "dim")
            detail = _detail(event)
            if detail:
                text.append(f"\n{detail}", "dim")
        else:
            text = Text(f"(unknown kind) {json.dumps(data)[:80]}")
        table.add_row(str(seq), f"{t * 1000:.1f}", kind, text)
    return table


def _detail(event: Event) -> str:
    """What `describe` leaves out of the engine events, worth a second line in a timeline."""
    if isinstance(event, Rendered):
        settings = event.settings or {}
        parts = [f"tokenizer={event.tokenizer}"] if event.tokenizer else []
        parts += [
            f"{name}={settings[key]}"
            for name, key in (
                ("eos", "eos_token_ids"),
                ("stop", "stop_sequences"),
                ("tool_parser", "tool_parser"),
                ("reasoning_parser", "reasoning_parser"),
                ("forced_tool", "forced_tool"),
            )
            if settings.get(key)
        ]
        if event.constraint:
            parts.append(f"constraint={_clip(json.dumps(event.constraint), 60)}")
        return " ".join(parts)
    if isinstance(event, Tokens) and event.prompt_tokens is not None and event.finish_reason:
        return f"prompt {event.prompt_tokens} + completion {event.completion_tokens} tokens"
    if isinstance(event, Counted):
        return "answered by the gateway's tokenizer; no engine call"
    return ""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
            value = json.loads(text)
        except (ValueError, RecursionError):
            return Text(text)
        # A lone surrogate escape (`"\\ud800"`) is valid JSON but no terminal can print the
        # character it decodes to: keep such strings escaped.
        return JSON(text, ensure_ascii=not _printable(value))
    return Text(text)


def _printable(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
