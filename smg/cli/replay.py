"""`smg replay`: run a journaled request again and say what changed.

- `smg replay ID --to URL`: send the recorded request to a gateway or worker (secrets from the
  operator, never from the journal), journal the run with `replay_of`, diff the answers.
- `smg replay ID --offline`: recompute a gRPC generation's blocks from its recorded engine
  tokens with today's pipeline (no engine), diff against the recorded blocks.
- `smg replay --offline [QUERY] --check`: the same for every matching request; a regression
  check over real traffic.
- `smg replay QUERY --to URL [--concurrency N] [--rate R] [--report FILE] [--fail-on-diff]`:
  every request the query selects, sent to the candidate and told in aggregate
  (`smg.cli.replay_batch`). A target that is one request's id (or unique prefix) is the
  single form unless one of those flags is given.

Exit codes: 0 identical, 1 differences, 2 usage errors (or a request that cannot be replayed);
the batch form's are `smg.cli.replay_batch`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from journal.events import Event
from journal.query import QueryError, compile_query
from journal.reader import AmbiguousRequestId, JournalError
from journal.schema import DEFAULT_PATH, ENV_VAR
from journal.store import JournalStore, is_postgres, open_journal, shown
from replay.batch import Options, Tally, select, selection
from replay.diff import render
from replay.offline import NotReplayable, Report, TokenizerUnavailable, check, load_tokenizer
from replay.remote import RemoteResult, ReplayError, replay_to
from smg.cli.replay_batch import replay_batch
from smg.pipeline.tokenizers.tokenizer import Tokenizer

IDENTICAL, DIFFERENT, USAGE = 0, 1, 2
_PAGE = 500


def _fail(message: str, code: int = USAGE) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


def replay(
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="ID|QUERY",
            help="A request id (or a unique prefix), or with --to a journal query: every request it selects;"
            " with --offline --check, a journal query (default: all).",
        ),
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="Base URL of a gateway or worker to send it to.")] = None,
    offline: Annotated[
        bool, typer.Option("--offline", help="Recompute from the recorded engine tokens; no engine.")
    ] = False,
    check_all: Annotated[
        bool, typer.Option("--check", help="With --offline: every request matching QUERY; exit 1 on any difference.")
    ] = False,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="'Name: value' to send (repeatable); e.g. credentials.")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="Send `Authorization: Bearer KEY` (the journal keeps no secret).")
    ] = None,
    mcp_token: Annotated[
        list[str] | None,
        typer.Option("--mcp-token", help="NAME=TOKEN: an MCP server's authorization_token (repeatable)."),
    ] = None,
    secret_url: Annotated[
        list[str] | None,
        typer.Option(
            "--secret-url",
            help="A URL of the body as the client sent it, credentials included; it replaces the recorded URL"
            " whose credentials were redacted (repeatable).",
        ),
    ] = None,
    journal: Annotated[
        str,
        typer.Option(
            "--journal",
            "-j",
            envvar=ENV_VAR,
            help="Journal to read: a file (with --to, the replay is recorded there too) or a postgresql:// URL of"
            f" the fleet journal (the replay is recorded by the gateway it goes to). Default ${ENV_VAR}, else"
            f" ./{DEFAULT_PATH}.",
        ),
    ] = DEFAULT_PATH,
    exact: Annotated[
        bool, typer.Option("--exact", help="With --to: compare ids (message, tool_use) and text as well.")
    ] = False,
    text: Annotated[
        bool, typer.Option("--text", help="With --to: compare text even when the request samples (no temperature 0).")
    ] = False,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="With --offline: a tokenizer to use instead of the recorded one.")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, help="With --to QUERY: requests in flight at once (default 1)."),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate", min=0.001, help="With --to QUERY: requests started per second at most (default: no limit)."
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", min=0.001, help="With --to QUERY: seconds for each answer; past it, failed (default 600)."
        ),
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="With --to QUERY: write the aggregate report there as JSON.")
    ] = None,
    fail_on_diff: Annotated[
        bool, typer.Option("--fail-on-diff", help="With --to QUERY: exit 1 when a request differed or failed.")
    ] = False,
    include_replays: Annotated[
        bool,
        typer.Option("--include-replays", help="With --to QUERY: select replays too (rows with replay_of)."),
    ] = False,
) -> None:
    """Replay a journaled request against a live target (--to) or offline through today's pipeline."""
    if (to is None) == (not offline):
        raise _fail("give exactly one of --to URL and --offline")
    if check_all and not offline:
        raise _fail("--check needs --offline")
    if offline and (header or api_key or mcp_token or secret_url or exact or text):
        raise _fail("--header, --api-key, --mcp-token, --secret-url, --exact and --text go with --to")
    if to is not None and tokenizer is not None:
        raise _fail("--tokenizer goes with --offline")
    batch = (
        concurrency is not None
        or rate is not None
        or timeout is not None
        or report is not None
        or fail_on_diff
        or include_replays
    )
    if batch and to is None:
        raise _fail("--concurrency, --rate, --timeout, --report, --fail-on-diff and --include-replays go with --to")
    if not check_all and not target:
        raise _fail("which request? give its id (or a unique prefix)")
    try:
        reader = open_journal(journal)
    except JournalError as exc:
        raise _fail(str(exc)) from exc
    console = Console()
    with reader:
        if check_all:
            raise typer.Exit(_check_all(console, reader, target, _tokenizer(tokenizer)))
        assert target is not None
        if to is not None:
            one = _one_request(reader, target, batch)
            if batch or one is None:
                options = Options(
                    concurrency=concurrency or 1,
                    rate=rate,
                    timeout=timeout or 600.0,
                    headers=_headers(header or [], api_key),
                    mcp_tokens=_pairs(mcp_token or [], "--mcp-token", "NAME=TOKEN"),
                    secret_urls=tuple(secret_url or ()),
                    exact=exact,
                    text=text or None,
                )
                query = None if one is not None else selection(target, include_replays=include_replays)
                raise typer.Exit(
                    _batch(console, reader, target, query, one, to, options, journal, report, fail_on_diff)
                )
        request_id, events = _load(reader, target)
    if offline:
        raise typer.Exit(_offline_one(console, request_id, events, _tokenizer(tokenizer)))
    assert to is not None
    sent = _headers(header or [], api_key)
    tokens = _pairs(mcp_token or [], "--mcp-token", "NAME=TOKEN")
    try:
        # The fleet journal is written by the replicas' shippers, never by a reader: a replay
        # read from it is journaled by the gateway it goes to (marked `replay_of`), not here.
        here = None if is_postgres(journal) else journal
        result = asyncio.run(
            replay_to(
                events,
                to,
                sent,
                here,
                exact=exact,
                text=text or None,
                mcp_tokens=tokens,
                secret_urls=secret_url or (),
            )
        )
    except ReplayError as exc:
        raise _fail(str(exc)) from exc
    raise typer.Exit(_show_remote(console, result, exact))


# -- input -------------------------------------------------------------------------------


def _one_request(reader: JournalStore, target: str, batch: bool) -> dict[str, Any] | None:
    """The request `target` names by id (or unique prefix), else None: then it is a query.
    An ambiguous prefix is an error in the single form (it lists the candidates), a query in
    the batch form."""
    try:
        return reader.get_request(target)
    except AmbiguousRequestId as exc:
        if batch:
            return None
        raise _fail(str(exc)) from exc
    except JournalError as exc:
        raise _fail(str(exc)) from exc


def _load(reader: JournalStore, id_or_prefix: str) -> tuple[str, list[Event]]:
    try:
        row = reader.get_request(id_or_prefix)
    except JournalError as exc:
        raise _fail(str(exc)) from exc
    if row is None:
        raise _fail(f"no request {id_or_prefix!r} in {reader.location}")
    request_id = str(row["id"])
    if row.get("bodies") not in (None, "full"):
        raise _fail(f"{request_id} was journaled with --journal-bodies {row['bodies']}: replay needs full bodies")
    return request_id, [e for _, e in reader.events(request_id)]


def _headers(raw: list[str], api_key: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise _fail(f"--header {item!r}: expected 'Name: value'")
        out[name.strip().lower()] = value.strip()
    return out


def _pairs(raw: list[str], flag: str, form: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _fail(f"{flag} {item!r}: expected {form}")
        out[name] = value
    return out


def _tokenizer(path: Path | None) -> Tokenizer | None:
    if path is None:
        return None
    try:
        return load_tokenizer(path)
    except TokenizerUnavailable as exc:
        raise _fail(str(exc)) from exc


def _matching(reader: JournalStore, query: str | None) -> Iterator[str]:
    """Ids of the requests `query` selects (all without one), oldest first, page by page."""
    try:
        compile_query(query or "")
    except QueryError as exc:
        raise _fail(f"bad query {query!r}: {exc}") from exc
    offset = 0
    while True:
        rows = reader.list_requests(_PAGE, query=query or "", offset=offset, descending=False)
        for row in rows:
            yield str(row["id"])
        if len(rows) < _PAGE:
            return
        offset += _PAGE


# -- offline -----------------------------------------------------------------------------


def _offline_one(console: Console, request_id: str, events: list[Event], tokenizer: Tokenizer | None) -> int:
    try:
        report = check(events, tokenizer)
    except NotReplayable as exc:
        raise _fail(str(exc)) from exc
    _show_report(console, report, verbose=True)
    return IDENTICAL if report.identical else DIFFERENT


def _show_report(console: Console, report: Report, *, verbose: bool) -> None:
    partial = " (the client went away: the recorded prefix compared)" if report.partial else ""
    if report.identical:
        if verbose:
            console.print(
                f"[green]identical[/] {escape(report.request_id)}: {len(report.recorded)} block events recomputed"
                f" byte for byte{partial}"
            )
        else:
            console.print(f"[green]ok[/]   {escape(report.request_id)}{partial}")
        return
    console.print(
        f"[red]DIFF[/] {escape(report.request_id)}: {len(report.differences)} difference(s) between the recorded"
        f" blocks and today's pipeline{partial}"
    )
    console.print(render(report.differences, left="recorded", right="recomputed"))


def _check_all(console: Console, reader: JournalStore, query: str | None, tokenizer: Tokenizer | None) -> int:
    counts = {"identical": 0, "different": 0, "skipped": 0, "failed": 0}
    for request_id in _matching(reader, query):
        events = [e for _, e in reader.events(request_id)]
        try:
            report = check(events, tokenizer)
        except TokenizerUnavailable as exc:
            counts["failed"] += 1
            console.print(f"[yellow]FAIL[/] {escape(request_id)}: {escape(str(exc))}")
            continue
        except NotReplayable:
            counts["skipped"] += 1
            continue
        counts["identical" if report.identical else "different"] += 1
        _show_report(console, report, verbose=False)
    checked = counts["identical"] + counts["different"]
    console.print(
        f"checked {checked}: {counts['identical']} identical, {counts['different']} different;"
        f" {counts['skipped']} skipped (not gRPC generations), {counts['failed']} could not be recomputed"
    )
    if counts["different"]:
        return DIFFERENT
    return USAGE if counts["failed"] else IDENTICAL


# -- remote ------------------------------------------------------------------------------


def _batch(
    console: Console,
    reader: JournalStore,
    target: str,
    query: str | None,
    one: dict[str, Any] | None,
    to: str,
    options: Options,
    journal: str,
    report: Path | None,
    fail_on_diff: bool,
) -> int:
    """The batch form: the one request `target` names (`one`), or every request `query` (the
    selection `target` makes as a query) selects."""
    if query is not None:
        try:
            reader.check(target)
            total: int | None = reader.count(query)
        except QueryError as exc:
            raise _fail(f"no request {target!r} in {reader.location}, and it is not a query: {exc}") from exc
        rows: Iterable[Mapping[str, Any]] = select(reader, query, before=time.time())
    else:
        assert one is not None
        rows, total = [one], 1
    # As in the single form: the fleet journal is written by the replicas' shippers only.
    here = None if is_postgres(journal) else journal
    tally = Tally(target=to, query=target, journal=shown(journal), options=options)
    return replay_batch(console, reader, rows, total, to, tally, here, report=report, fail_on_diff=fail_on_diff)


def _show_remote(console: Console, result: RemoteResult, exact: bool) -> int:
    target_id = f" (the target's id {result.target_request_id})" if result.target_request_id else ""
    console.print(
        f"replayed {escape(result.original_id)} to {escape(result.url)}: journaled as"
        f" {escape(result.replay_id)}{escape(target_id)}, replay_of {escape(result.original_id)}"
    )
    if result.status is None:
        console.print(f"[red]no answer:[/] {escape(result.error or '')}")
        return USAGE
    if result.error:
        console.print(f"[yellow]the answer broke off:[/] {escape(result.error)}")
    compared = "structure, text" if result.text_compared else "structure"
    if exact:
        compared += ", ids"
    if not result.text_compared:
        console.print(
            "[dim]text not compared: the request samples (neither temperature 0 nor top_k 1);"
            " --text compares it anyway[/]"
        )
    if result.identical:
        console.print(f"[green]identical[/] (HTTP {result.status}; compared: {compared})")
        return IDENTICAL
    console.print(f"[red]{len(result.differences)} difference(s)[/] (HTTP {result.status}; compared: {compared})")
    if result.differences:
        console.print(render(result.differences, left="original", right="replay"))
    return DIFFERENT
