"""`smg journal …`: read a journal from the terminal.

`ls` (a filtered, sorted table of requests), `show` (one request: timeline, request, response),
`tail` (requests as they complete), `export` (one request as curl, JSON or HAR; many as HAR,
JSON lines or OpenTelemetry spans), `stats` (counts, errors, latency percentiles, token
throughput; per group and time bucket, or as a chart), `thread` (one conversation, turn by
turn) and `diff` (two requests side by side). Every command opens the file
read-only, so it works next to a running gateway. The pure parts live in `journal.export`,
`journal.stats`, `journal.groups`, `journal.threads`, `journal.otlp`
and `journal.follow`; this module parses flags and renders.
"""

from __future__ import annotations

import enum
import json
import shutil
import signal
import sqlite3
import sys
import time
import unicodedata
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import orjson

from journal import export as exporting
from journal import groups
from journal.events import Counted, Event, Received, Rendered, Tokens, event_from_dict, event_kinds
from journal.query import QueryError, compile_query
from journal.reader import JournalError, JournalNotFound
from journal.schema import DEFAULT_PATH, ENV_VAR, REQUEST_COLUMNS
from journal.store import REPLICA, JournalStore, is_postgres, open_journal, shown
from smg.cli.params import Argument, Commands, Option

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

# rich, the request views and the projection are imported by the commands that print with
# them: a journal command starts in well under a second, JSON output without rich at all.
commands = Commands(
    help="Inspect the request journal (read-only; safe while the gateway runs).",
    no_args_is_help=True,
)

JournalOpt = Annotated[
    str,
    Option(
        "--journal",
        "-j",
        envvar=ENV_VAR,
        help=f"Journal file or postgresql:// URL of the fleet journal (default: ${ENV_VAR}, else ./{DEFAULT_PATH}).",
    ),
]
JsonOpt = Annotated[bool, Option("--json", help="Print JSON instead of tables.")]
QueryArg = Annotated[
    str,
    Argument(help="Which requests, in the journal query language (default: all).", show_default=False),
]


def __getattr__(name: str) -> Any:
    if name == "journal_app":  # the typer app, built only when typer is to read the command line
        return commands.typer()
    raise AttributeError(name)


def _echo(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _fail(message: str, code: int = 1) -> NoReturn:
    _console(stderr=True).print(f"[red]error:[/] {_escape(message)}")
    raise SystemExit(code)


def _open(path: str) -> JournalStore:
    try:
        return open_journal(path)
    except JournalError as exc:
        _fail(str(exc))


def _compile(query: str) -> None:
    """Fail on a bad query, before opening anything: a usage error (exit 2)."""
    try:
        compile_query(query)
    except QueryError as exc:
        _fail(f"bad query {query!r}: {exc}", code=2)


def _echo_json(value: Any) -> None:
    _echo(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode())


@commands.command("ls")
def ls(
    query: QueryArg = "",
    journal: JournalOpt = DEFAULT_PATH,
    limit: Annotated[int, Option("--limit", "-n", min=1, help="How many requests.")] = 50,
    offset: Annotated[int, Option("--offset", min=0, help="Skip this many first.")] = 0,
    sort: Annotated[
        str, Option("--sort", "-s", help=f"Sort by this summary column: {', '.join(REQUEST_COLUMNS)}.")
    ] = "ts",
    asc: Annotated[bool, Option("--asc", help="Smallest first (default: largest, i.e. newest, first).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List requests matching QUERY, newest first (or by --sort)."""
    if sort not in REQUEST_COLUMNS:
        _fail(f"--sort: no column {sort!r}; one of {', '.join(REQUEST_COLUMNS)}", code=2)
    with _open(journal) as reader:
        where = reader.location
        try:
            rows, total = reader.page(limit, query=query, offset=offset, order=sort, descending=not asc)
        except QueryError as exc:
            _fail(f"bad query {query!r}: {exc}", code=2)
    if as_json:
        _echo_json(rows)
        return
    cells = [_cells(row) for row in rows]
    shown = f"{len(rows)} of {total}" if total != len(rows) else str(total)
    order = f"{sort}, {'smallest' if asc else 'largest'} first" if sort != "ts" else "oldest first" if asc else ""
    title = f"{shown} requests{f' matching {query!r}' if query else ''}{f' by {order}' if order else ''} ({where})"
    width = shutil.get_terminal_size().columns
    _echo(_ls_text(title, cells, width, replicas=any(row.get(REPLICA) for row in rows)))


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
        "replica": row.get(REPLICA) or "",
    }


@commands.command("show")
def show(
    request_id: Annotated[
        str, Argument(help="Request id (the gateway's, a unique prefix of it, or a client's unique id).")
    ],
    journal: JournalOpt = DEFAULT_PATH,
    as_json: JsonOpt = False,
) -> None:
    """One request: its event timeline, the request, the response the client got, the answer
    assembled from it (blocks, stop reason, usage) and a waterfall of its stages."""
    from journal import waterfall

    row, raw, events = _load(journal, request_id)
    response, why = _reconstruct(events)
    answer, stages = _answer(events), waterfall.stages(raw)

    if as_json:
        shown = exporting.as_json(row, raw, response, response_error=why)
        _echo_json({**shown, "answer": answer, "waterfall": [s.to_dict() for s in stages]})
        return

    from rich.markup import escape
    from rich.panel import Panel
    from rich.text import Text

    from replay.answer import answer_view, waterfall_view

    console = _console()
    console.print(
        Panel(
            Text.assemble(
                (row["id"], "bold"),
                *([f"  client id {row['client_id']}"] if row["client_id"] not in (None, row["id"]) else []),
                f"  {_clock(row['ts'], full=True)}  status {_status(row)}",
                f"  model {row['model'] or '-'}  backend {row['backend'] or '-'}",
                f"  worker {row['worker'] or '-'}",
                *([f"  replica {row[REPLICA]}"] if row.get(REPLICA) else []),
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
    if answer is not None:
        console.print(Panel(answer_view(answer), title="answer (as the client assembled it)", title_align="left"))
    console.print(Panel(waterfall_view(stages), title="waterfall", title_align="left"))


def _answer(events: list[Event]) -> dict[str, Any] | None:
    from replay.answer import assemble

    try:
        return assemble(events)
    except Exception:  # a projection bug must not hide the rest of the request
        return None


@commands.command("tail")
def tail(
    query: QueryArg = "",
    journal: JournalOpt = DEFAULT_PATH,
    interval: Annotated[float, Option("--interval", min=0.01, help="Seconds between looks.")] = 0.5,
    as_json: Annotated[bool, Option("--json", help="One JSON summary per line (JSON Lines).")] = False,
    max_count: Annotated[
        int | None, Option("--max", min=1, help="Stop after this many requests.", show_default=False)
    ] = None,
    timeout: Annotated[
        float | None, Option("--timeout", min=0, help="Stop after this many seconds.", show_default=False)
    ] = None,
) -> None:
    """Follow the journal: print each request matching QUERY as it completes (Ctrl-C stops)."""
    from rich.console import Console
    from rich.markup import escape

    _compile(query)  # a bad query fails before waiting for the file
    _stop_on_ctrl_c()
    deadline = None if timeout is None else time.monotonic() + timeout
    err = Console(stderr=True)
    out = Console(highlight=False)
    try:
        reader = _wait_for(journal, deadline, err)
        if reader is None:
            return
        with reader:
            follower = reader.follower(query)
            err.print(f"[dim]following {escape(reader.location)}{escape(f' for {query!r}') if query else ''}…[/]")
            shown = 0
            while True:
                for request_id in follower.poll():
                    row = reader.get_request(request_id)
                    if row is None:  # pruned between the two reads
                        continue
                    if as_json:
                        _echo(orjson.dumps(row, default=str).decode())
                    else:
                        out.print(_tail_line(row), soft_wrap=True)
                    shown += 1
                    if max_count is not None and shown >= max_count:
                        return
                if not _sleep(interval, deadline):
                    return
    except KeyboardInterrupt:
        return


def _stop_on_ctrl_c() -> None:
    """Ctrl-C (SIGINT) is how a tail with no `--max`/`--timeout` ends, so it must raise
    KeyboardInterrupt even when this process inherited SIGINT ignored or blocked: a shell
    starts its background jobs (`cmd &` in a script, many CI runners and test harnesses) with
    SIGINT ignored, the ignore survives exec, and Python then never installs its handler."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _wait_for(path: str, deadline: float | None, err: Console) -> JournalStore | None:
    """The journal, once it exists (a tail may start before the gateway); None on timeout."""
    from rich.markup import escape

    said = False
    while True:
        try:
            return open_journal(path)
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
    from rich.text import Text

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
    jsonl = "jsonl"
    otlp = "otlp"


_MANY = frozenset({ExportFormat.har, ExportFormat.jsonl, ExportFormat.otlp})


@commands.command("export")
def export(
    target: Annotated[
        str,
        Argument(
            help="A request id (the gateway's, a unique prefix of it, or a client's unique id); for har, jsonl and "
            "otlp, else a query selecting many requests (default: all).",
            show_default=False,
        ),
    ] = "",
    journal: JournalOpt = DEFAULT_PATH,
    fmt: Annotated[
        ExportFormat,
        Option(
            "--as",
            help="curl: a command that sends the request again (keys from $SMG_API_KEY / $ANTHROPIC_API_KEY); "
            "json: summary, events and response; har: an HTTP Archive 1.2 log; jsonl: one JSON document "
            "per request and line; otlp: OpenTelemetry spans per stage, one OTLP/JSON export request per line.",
        ),
    ] = ExportFormat.json,
    url: Annotated[str, Option("--url", help="The gateway's base URL, for curl and HAR.")] = exporting.DEFAULT_BASE_URL,
    limit: Annotated[
        int | None,
        Option("--limit", "-n", min=1, help="At most this many requests (a query; default: all).", show_default=False),
    ] = None,
) -> None:
    """Print one request as a curl command, a JSON document or a HAR log; or the requests a
    query selects, oldest first, as HAR, JSON lines or OpenTelemetry spans."""
    from journal import otlp

    with _open(journal) as reader:
        try:
            single = reader.get_request(target) if target else None
        except JournalError as exc:
            if fmt not in _MANY:
                _fail(str(exc))
            single = None
        if single is None and fmt in _MANY:
            _export_many(reader, target, fmt, url, limit)
            return
    if not target:
        _fail(f"--as {fmt.value} exports one request: name it")
    row, raw, events = _load(journal, target)
    if row.get("bodies") not in (None, "full"):
        _console(stderr=True).print(
            f"[yellow]warning:[/] {_escape(row['id'])} was journaled with bodies {_escape(str(row['bodies']))}:"
            " its request and response content are not the ones sent"
        )
    received = next((e for e in events if isinstance(e, Received)), None)
    if fmt is ExportFormat.json:
        response, why = _reconstruct(events)
        _echo_json(exporting.as_json(row, raw, response, response_error=why))
    elif fmt is ExportFormat.jsonl:
        response, why = _reconstruct(events)
        _echo(orjson.dumps(exporting.as_json(row, raw, response, response_error=why), default=str).decode())
    elif fmt is ExportFormat.otlp:
        _echo(orjson.dumps(otlp.spans(row, raw)).decode())
    elif received is None:
        _fail(f"request {row['id']} has no `received` event to export")
    elif fmt is ExportFormat.curl:
        _echo(exporting.as_curl(received, url))
    else:
        response, _ = _reconstruct(events)
        _echo_json(exporting.as_har(events, response, url, creator_version=_version()))


_EXPORT_PAGE = 500  # requests read at a time: an export of any size holds one page


def _selected(reader: JournalStore, query: str, limit: int | None) -> Iterator[dict[str, Any]]:
    """The summary rows `query` selects, in the order the journal recorded them, a page at a
    time by row key (each page a seek past the last key: no request is skipped or repeated
    while the gateway adds rows, and a big journal is read once); at most `limit`, and a line
    on stderr when the limit left some out."""
    after, count = 0, 0
    while True:
        size = _EXPORT_PAGE if limit is None else min(_EXPORT_PAGE, limit - count + 1)
        rows = reader.list_after(size, query=query, after=after)
        for after, row in rows:
            if limit is not None and count >= limit:
                _console(stderr=True).print(
                    f"[yellow]export stopped at --limit {limit}:[/] the query selects more requests"
                )
                return
            count += 1
            yield row
        if len(rows) < size:
            return


def _export_many(reader: JournalStore, query: str, fmt: ExportFormat, url: str, limit: int | None) -> None:
    from journal import otlp

    try:
        reader.check(query)
    except QueryError as exc:
        _fail(f"{query!r} is neither a request id nor a good query: {exc}", code=2)
    known = set(event_kinds())
    har_entries = 0  # HAR: one log, its entries written as they come
    for row in _selected(reader, query, limit):
        raw = reader.raw_events(row["id"])
        if fmt is ExportFormat.otlp:
            _echo(orjson.dumps(otlp.spans(row, raw)).decode())
            continue
        events = [event_from_dict(kind, data, t) for _, kind, t, data in raw if kind in known]
        response, why = _reconstruct(events)
        if fmt is ExportFormat.jsonl:
            _echo(orjson.dumps(exporting.as_json(row, raw, response, response_error=why), default=str).decode())
        elif any(isinstance(e, Received) for e in events):
            log = exporting.as_har(events, response, url, creator_version=_version())
            entries = log["log"].pop("entries")
            if not har_entries:
                head = orjson.dumps(log, default=str)
                sys.stdout.write(head[:-2].decode() + ',"entries":[')
            for entry in entries:
                sys.stdout.write(("," if har_entries else "") + orjson.dumps(entry, default=str).decode())
                har_entries += 1
    if fmt is ExportFormat.har:
        if har_entries:
            sys.stdout.write("]}}\n")
        else:
            _echo_json({"log": {"version": "1.2", "creator": {"name": "smg"}, "entries": []}})


@commands.command("stats")
def stats(
    query: QueryArg = "",
    journal: JournalOpt = DEFAULT_PATH,
    by: Annotated[
        str | None,
        Option("--by", help=f"Per group: {', '.join(groups.GROUPS)}.", show_default=False),
    ] = None,
    every: Annotated[
        str | None, Option("--every", help="Per time bucket of this width: 1m, 1h, 1d.", show_default=False)
    ] = None,
    plot: Annotated[
        str | None,
        Option(
            "--plot",
            help="Chart one series per bucket (default --every 1m): requests, errors, error_rate, latency_p99, "
            "ttft_p50, tokens_out, …",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Counts, error codes, stop reasons, latency percentiles and token throughput of QUERY;
    with --by and/or --every, the same per group and time bucket."""
    _compile(query)
    if by is not None and by not in groups.GROUPS:
        _fail(f"--by: no group {by!r}; one of {', '.join(groups.GROUPS)}", code=2)
    try:
        width = groups.parse_every(every) if every is not None else (60 if plot else None)
        if plot is not None:
            groups.series([_EMPTY_GROUP], plot)
    except ValueError as exc:
        _fail(str(exc), code=2)
    if by is not None or width is not None:
        with _open(journal) as reader:
            rows = reader.group_stats(query, by=by, every=width)
            points: list[tuple[Any, float | None]] = []
            if plot:  # the chart is of every group together: a second pass only for it
                overall = rows if by is None else reader.group_stats(query, every=width)
                points = groups.series(overall, plot)
            where = reader.location
            source = reader.stats_source
        if as_json:
            extra = {"plot": plot, "series": points} if plot else {}
            _echo_json({"by": by, "every_s": width, "rows": rows, "source": source, **extra})
            return
        from rich.text import Text

        console = _console()
        if plot:
            console.print(_plot(points, plot, width or 60, query))
        else:
            console.print(_groups_table(rows, by, width, query, where))
        console.print(Text(source, style="dim"))
        return
    with _open(journal) as reader:
        numbers = reader.stats(query)
        where = reader.location
    if as_json:
        _echo_json(numbers)
        return
    _echo(_stats_text(numbers, query, where))


@commands.command("thread")
def thread_cmd(
    request_id: Annotated[str, Argument(help="Any request of the conversation (id, unique prefix, client id).")],
    journal: JournalOpt = DEFAULT_PATH,
    limit: Annotated[int, Option("--limit", "-n", min=1, help="At most this many turns.")] = 500,
    as_json: JsonOpt = False,
) -> None:
    """The requests of one conversation, oldest first, with what each turn added.

    A conversation is the requests with the same session header (Claude Code's
    x-claude-code-session-id), else with the same start: system prompt and first message.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from journal import threads

    with _open(journal) as reader:
        try:
            turns = threads.thread(reader, request_id, limit)
        except JournalError as exc:
            _fail(str(exc))
    if turns is None:
        _fail(f"no request {request_id!r} with a conversation in {shown(journal)}")
    if as_json:
        _echo_json(
            [
                {"request": t.row, "messages": t.messages, "added": t.added, "history_rewritten": t.rewritten}
                for t in turns
            ]
        )
        return
    key = turns[0].row["thread_key"] if turns else ""
    table = Table(title=f"{len(turns)} turns of conversation {key} ({shown(journal)})", title_justify="left")
    for name, right in (("#", True), ("id", False), ("time", False), ("status", True), ("model", False)):
        table.add_column(name, justify="right" if right else "left", no_wrap=True)
    table.add_column("in/out", justify="right", no_wrap=True)
    table.add_column("added", overflow="fold", min_width=30)
    for n, turn in enumerate(turns, 1):
        row = turn.row
        style = "bold" if row["id"] == request_id or row.get("client_id") == request_id else ""
        table.add_row(
            str(n),
            Text(row["id"], style=style),
            _clock(row["ts"]),
            _status(row),
            row["model"] or "",
            _tokens(row),
            Text(turn.summary(), style="yellow" if turn.rewritten else ""),
        )
    Console().print(table)


@commands.command("diff")
def diff_cmd(
    left: Annotated[str, Argument(help="The first request (id, unique prefix, client id).")],
    right: Annotated[str, Argument(help="The second request.")],
    journal: JournalOpt = DEFAULT_PATH,
    as_json: JsonOpt = False,
) -> None:
    """A structural diff of two requests: summary fields, the request bodies, and the
    responses the clients got (as replay compares a request and its replay)."""
    from rich.console import Console
    from rich.text import Text

    from journal import threads
    from replay.diff import Difference, render
    from replay.diff import diff as diff_responses

    sides = [_load(journal, rid) for rid in (left, right)]
    (row_a, _, events_a), (row_b, _, events_b) = sides
    fields = ("model", "backend", "worker", "status", "error_code", "stop_reason", "input_tokens", "output_tokens")
    summary = [Difference(f, row_a[f], row_b[f]) for f in fields if row_a[f] != row_b[f]]
    with _open(journal) as reader:
        bodies = threads.json_diff(threads.request_body(reader, row_a["id"]), threads.request_body(reader, row_b["id"]))
    request = [Difference(path, x, y) for path, x, y in bodies]
    (resp_a, why_a), (resp_b, why_b) = _reconstruct(events_a), _reconstruct(events_b)
    if resp_a is not None and resp_b is not None:
        response = diff_responses(resp_a, resp_b, text=True)
    else:
        response = [Difference("response", why_a, why_b)]
    if as_json:
        _echo_json(
            {
                "left": row_a["id"],
                "right": row_b["id"],
                **{
                    name: [vars(d) for d in part]
                    for name, part in (("summary", summary), ("request", request), ("response", response))
                },
            }
        )
        return
    console = Console()
    for name, part in (("summary", summary), ("request body", request), ("response", response)):
        if part:
            console.print(render(part, left=row_a["id"], right=row_b["id"], title=name))
        else:
            console.print(Text(f"{name}: the same", style="green"))


@commands.command("prune")
def prune(
    journal: JournalOpt = DEFAULT_PATH,
    older_than: Annotated[
        str | None, Option("--older-than", help="Delete requests that arrived longer ago than this (7d, 12h).")
    ] = None,
    max_size: Annotated[
        str | None, Option("--max-size", help="Delete the oldest requests until the data fits (500MB, 2GB).")
    ] = None,
    shrink: Annotated[
        bool,
        Option("--shrink", help="Also give the freed space back to the file system (slower: pages are moved)."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete whole requests, oldest first, by age and/or size (the one command that writes).

    Safe while the gateway runs: it deletes in small transactions the gateway interleaves
    with its own, and keeps requests that may still be in flight. On the fleet journal
    (a postgresql:// URL) it drops whole days, and trims the day the age falls in.
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
    if is_postgres(journal):
        result = _prune_fleet(journal, max_age_s, max_bytes)
    else:
        try:
            result = prune_journal(journal, max_age_s=max_age_s, max_bytes=max_bytes, shrink=shrink)
        except FileNotFoundError as exc:
            _fail(str(exc))
        except (sqlite3.DatabaseError, SchemaTooNew) as exc:
            _fail(f"{journal} cannot be pruned: {exc}")
    if as_json:
        _echo_json(vars(result))
        return
    _echo(
        f"pruned {result.requests_deleted} requests ({result.events_deleted} events) from {shown(journal)}:"
        f" {result.bytes_before / 1e6:.1f} MB -> {result.bytes_after / 1e6:.1f} MB of data"
    )


def _prune_fleet(url: str, max_age_s: float | None, max_bytes: int | None) -> Any:
    """`prune` of the fleet journal: whole days dropped (`journal.pg.prune`)."""
    import psycopg

    from journal.pg.prune import prune as prune_fleet

    try:
        return prune_fleet(url, max_age_s=max_age_s, max_bytes=max_bytes)
    except psycopg.Error as exc:
        _fail(f"{shown(url)} cannot be pruned: {str(exc).strip() or type(exc).__name__}")


# -- pieces ------------------------------------------------------------------------------


def _load(journal: str, request_id: str) -> tuple[dict[str, Any], list[exporting.RawEvent], list[Event]]:
    """A request's summary row, its events as stored, and the ones this version knows."""
    with _open(journal) as reader:
        try:
            row = reader.get_request(request_id)
        except JournalError as exc:
            _fail(str(exc))
        if row is None:
            _fail(f"no request {request_id!r} in {shown(journal)}")
        raw = reader.raw_events(row["id"])
    known = set(event_kinds())
    return row, raw, [event_from_dict(kind, data, t) for _, kind, t, data in raw if kind in known]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("smg-py")
    except PackageNotFoundError:
        return ""


def _stats_text(numbers: dict[str, Any], query: str, journal: str) -> str:
    """The whole-selection statistics as plain text: printed without rich, whose import and
    layout took as long as the statistics themselves."""
    from journal import sketch

    n = numbers["requests"]
    span = ""
    if numbers["first_ts"] is not None:
        span = f", {_clock(numbers['first_ts'], full=True)} → {_clock(numbers['last_ts'], full=True)}"
    rate = f" ({numbers['errors'] / n:.1%})" if n else ""
    lines = [
        f"{n} requests{f' matching {query!r}' if query else ''} in {journal}{span}",
        f"completed {numbers['completed']}, in flight {numbers['in_flight']}, errors {numbers['errors']}{rate}",
    ]
    counts = [
        _count_lines(title, numbers[key], n)
        for key, title in (
            ("by_status_class", "status"),
            ("by_model", "model"),
            ("by_backend", "backend"),
            ("error_codes", "error code"),
            ("stop_reasons", "stop reason"),
        )
        if numbers[key]
    ]
    if counts:
        lines += ["", *_side_by_side(counts, gap=3)]
    labels = [k for k in numbers["latency_ms"]["duration"] if k.startswith("p")]
    latency = [["", "count", *labels, "mean", "max"]]
    for name, dist in (("duration", numbers["latency_ms"]["duration"]), ("first event", numbers["latency_ms"]["ttfe"])):
        latency.append([name, str(dist["count"]), *(_num(dist[k]) for k in (*labels, "mean", "max"))])
    lines += ["", "latency (ms)", *_aligned(latency, right_from=1), ""]
    tok = numbers["tokens"]
    lines.append(
        f"tokens input {tok['input']}, output {tok['output']}; output tokens/s {_num(tok['output_per_s'])} overall"
        f", {_num(tok['output_per_s_median'])} median per request ({tok['rated_requests']} requests)"
    )
    spend = numbers.get("cost_usd") or {}
    if spend.get("priced_requests"):
        lines.append(f"cost ${spend['total']:.4f} ({spend['priced_requests']} priced requests)")
    source = numbers.get("source")
    if source == "rollups":
        read = f" and {numbers['scanned']} requests read" if numbers.get("scanned") else ""
        lines.append(f"from rollups{read}; percentiles within {sketch.RELATIVE_ERROR:.1%}")
    elif source == "scan":
        lines.append(f"scanned {numbers['scanned']} requests")
    return "\n".join(lines)


def _count_lines(title: str, counts: dict[Any, int], total: int) -> list[str]:
    rows = [[str(value), str(count), f"{count / total:.0%}" if total else ""] for value, count in counts.items()]
    return [title, *_aligned(rows, right_from=1)]


def _aligned(rows: list[list[str]], right_from: int) -> list[str]:
    """Rows of cells in columns a space apart, left-aligned before column `right_from`."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        " ".join(cell.ljust(w) if i < right_from else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]


def _side_by_side(blocks: list[list[str]], gap: int) -> list[str]:
    widths = [max(map(len, block)) for block in blocks]
    height = max(map(len, blocks))
    return [
        (" " * gap).join((block[i] if i < len(block) else "").ljust(w) for block, w in zip(blocks, widths)).rstrip()
        for i in range(height)
    ]


_EMPTY_GROUP: dict[str, Any] = {
    "group": None,
    "bucket": None,
    "requests": 0,
    "errors": 0,
    "error_rate": 0.0,
    "hung_up": 0,
    "latency_ms": {"count": 0, "p50": None, "p90": None, "p99": None},
    "ttft_ms": {"count": 0, "p50": None, "p90": None, "p99": None},
    "tokens_in": 0,
    "tokens_out": 0,
    "cost_usd": None,
}


def _bucket_label(bucket: Any, width: int | None) -> str:
    if bucket is None:
        return "-"
    fmt = "%Y-%m-%d" if width and width >= 86400 else "%m-%d %H:%M" if width and width >= 60 else "%m-%d %H:%M:%S"
    return time.strftime(fmt, time.localtime(bucket))


def _groups_table(rows: list[dict[str, Any]], by: str | None, width: int | None, query: str, journal: str) -> Table:
    from rich.table import Table

    what = " and ".join(p for p in (f"by {by}" if by else "", f"every {width}s" if width else "") if p)
    table = Table(title=f"requests{f' matching {query!r}' if query else ''} {what} ({journal})", title_justify="left")
    if width:
        table.add_column("time", no_wrap=True)
    if by:
        table.add_column(by, no_wrap=True)
    priced = any(row.get("cost_usd") is not None for row in rows)
    names = ("requests", "errors", "err %", "hung up", "p50 ms", "p99 ms", "ttft p50", "ttft p99", "in", "out")
    for name in (*names, "cost $") if priced else names:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        lat, ttft = row["latency_ms"], row["ttft_ms"]
        cells = [_bucket_label(row["bucket"], width)] if width else []
        cells += [str(row["group"] if row["group"] is not None else "-")] if by else []
        cells += [
            str(row["requests"]),
            str(row["errors"]),
            f"{row['error_rate']:.1%}",
            str(row["hung_up"]),
            _num(lat["p50"]),
            _num(lat["p99"]),
            _num(ttft["p50"]),
            _num(ttft["p99"]),
            str(row["tokens_in"]),
            str(row["tokens_out"]),
        ]
        if priced:
            cells.append("-" if row.get("cost_usd") is None else f"{row['cost_usd']:.4f}")
        table.add_row(*cells)
    return table


_BARS = " ▏▎▍▌▋▊▉█"


def _plot(points: list[tuple[Any, float | None]], metric: str, width: int, query: str) -> Group:
    """One horizontal bar per bucket, scaled to the largest value."""
    from rich.console import Group
    from rich.text import Text

    top = max((v for _, v in points if v is not None), default=0.0)
    lines = [Text(f"{metric} every {width}s{f' for {query!r}' if query else ''} (max {_num(top)})", style="bold")]
    span = 50
    for bucket, value in points:
        label = f"{_bucket_label(bucket, width):>14} "
        if value is None:
            lines.append(Text(label + "-", style="dim"))
            continue
        eighths = round(value / top * span * 8) if top > 0 else 0
        bar = "█" * (eighths // 8) + (_BARS[eighths % 8] if eighths % 8 else "")
        lines.append(Text.assemble(label, (bar, "cyan"), f" {_num(value)}"))
    return Group(*lines)


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


def _ls_text(title: str, cells: list[dict[str, str]], width: int, *, replicas: bool = False) -> str:
    """The ls table as plain text, in `width` columns: the least important columns are left
    out until the rest fit; `replicas`: with the replica column (rows of the fleet journal).
    Printed without rich, whose import and layout took longer than reading the journal."""
    columns = (*_LS_COLUMNS[:1], "replica", *_LS_COLUMNS[1:]) if replicas else _LS_COLUMNS
    order = (*_ORDER[:1], "replica", *_ORDER[1:]) if replicas else _ORDER
    widest = {name: max([len(name), *(_cell_width(row[name]) for row in cells)]) for name in order}
    keep = len(columns)
    while keep > 3 and sum(widest[name] + 2 for name in order if name in columns[:keep]) - 2 > width:
        keep -= 1
    shown = [name for name in order if name in columns[:keep]]

    def line(values: list[str]) -> str:
        return "  ".join(
            _pad(value, widest[name], right=name in _RIGHT) for name, value in zip(shown, values, strict=True)
        ).rstrip()

    rule = "  ".join("─" * widest[name] for name in shown)
    return "\n".join([title, line(shown), rule, *(line([row[name] for name in shown]) for row in cells)])


def _cell_width(text: str) -> int:
    return len(text) + sum(1 for c in text if ord(c) > 0x1100 and unicodedata.east_asian_width(c) in "WF")


def _pad(text: str, width: int, *, right: bool) -> str:
    fill = " " * (width - _cell_width(text))
    return fill + text if right else text + fill


def _reconstruct(events: list[Event]) -> tuple[Any, str | None]:
    try:
        from smg import projection

        return projection.reconstruct(events), None
    except Exception as exc:  # a projection bug must not hide the timeline
        return None, f"reconstruct failed: {type(exc).__name__}: {exc}"


def _timeline(raw: list[tuple[int, str, float, dict[str, Any]]]) -> Table:
    from rich.table import Table
    from rich.text import Text

    from journal.summary import describe

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
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    headers = Table.grid(padding=(0, 1))
    for name, value in received.headers.items():  # stored redacted
        headers.add_row(Text(f"{name}:", style="cyan"), Text(value))
    query = f"?{received.query}" if received.query else ""
    parts: list[Any] = [Text(f"{received.method} {received.path}{query}", style="bold"), headers]
    if received.body:
        parts.append(_body(received.body, "application/json"))
    return Panel(Group(*parts), title="request as received", title_align="left")


def _response_view(status: int | None, headers: dict[str, str], body: bytes) -> Panel:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

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
    from rich.json import JSON
    from rich.text import Text

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
