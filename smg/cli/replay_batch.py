"""`smg replay QUERY --to URL`: the batch form's progress bar, summary and JSON report.

The replaying is `replay.batch`'s; this module shows it: a rich progress bar while it runs
(on a terminal), then the counts, the kinds of difference, the failures, the latency and time
to first token of the candidate beside the recorded ones, and a few ids of each kind to look
at (`smg journal diff ORIGINAL REPLAY`). `--report FILE.json` writes `Tally.report()`.

Exit codes: 0 when the batch ran (whatever it found), 1 with `--fail-on-diff` when a request
was different or failed, 2 when nothing could be selected or the report cannot be written,
130 when Ctrl-C stopped it (the summary and report then say what was replayed until then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from journal.store import JournalStore
from replay.batch import FAILURES, KINDS, Tally, run
from smg.cli.journal import _stop_on_ctrl_c

OK, DIFFERENT, USAGE, INTERRUPTED = 0, 1, 2, 130
_SHOWN = 5  # ids shown per kind in the text summary (the JSON report keeps more)


def replay_batch(
    console: Console,
    store: JournalStore,
    rows: Iterable[Mapping[str, Any]],
    total: int | None,
    url: str,
    tally: Tally,
    journal_path: str | None,
    *,
    report: Path | None = None,
    fail_on_diff: bool = False,
) -> int:
    """Run the batch with a progress bar, print its summary, write the report; the exit code."""
    progress = Progress(
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    bar = progress.add_task("replay", total=total, counts="")

    def advance(done: Tally) -> None:
        counts = f"{done.identical} same · {done.different} diff · {done.failed} failed · {done.skipped} skipped"
        progress.update(bar, completed=done.done, counts=counts)

    _stop_on_ctrl_c()
    try:
        with progress:
            asyncio.run(run(store, rows, url, tally, journal_path, on_done=advance))
    except KeyboardInterrupt:
        tally.interrupted = True
    data = tally.report()
    if report is not None:
        try:
            report.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
        except OSError as exc:
            Console(stderr=True).print(f"[red]error:[/] cannot write the report {escape(str(report))}: {exc}")
            return USAGE
    if not tally.done and not tally.interrupted:
        Console(stderr=True).print(f"[red]error:[/] no request matches {tally.query!r} in {escape(tally.journal)}")
        return USAGE
    _show(console, data)
    if tally.interrupted:
        console.print("[yellow]interrupted[/]: the counts are those of the requests replayed before Ctrl-C")
        return INTERRUPTED
    if fail_on_diff and (tally.different or tally.failed):
        return DIFFERENT
    return OK


def _show(console: Console, data: dict[str, Any]) -> None:
    options = data["options"]
    pace = f", at most {options['rate']:g}/s" if options["rate"] else ""
    console.print(
        f"replayed {data['replayed']} of {data['selected']} selected to {escape(data['target'])}"
        f" (concurrency {options['concurrency']}{pace}): [green]{data['identical']} identical[/],"
        f" [red]{data['different']} different[/], [yellow]{data['failed']} failed[/], {data['skipped']} skipped"
    )
    answered = data["replayed"] - data["failed"]
    if data["text_compared"] < answered:
        console.print(
            f"[dim]text compared on {data['text_compared']} of {answered} answers: the others sample (neither"
            " temperature 0 nor top_k 1); --text compares them anyway[/]"
        )
    kinds = ", ".join(f"{kind} {n}" for kind, n in data["different_by_kind"].items() if n)
    if kinds:
        console.print(f"different by kind (a request may differ in several): {kinds}")
    failures = ", ".join(f"{kind} {n}" for kind, n in data["failed_by_kind"].items() if n)
    if failures:
        console.print(f"failed: {failures}")
    for reason, n in list(data["skipped_reasons"].items())[:_SHOWN]:
        console.print(f"[dim]skipped {n}: {escape(reason)}[/]")
    table = Table(title_justify="left", box=None)
    table.add_column("ms")
    for side in ("recorded", "candidate"):
        for label in ("p50", "p90", "p99"):
            table.add_column(f"{side} {label}", justify="right")
    for name in ("latency", "ttft"):
        cells = [
            data[f"{name}_ms"][side][label] for side in ("recorded", "candidate") for label in ("p50", "p90", "p99")
        ]
        table.add_row(name, *("-" if v is None else f"{v:.1f}" for v in cells))
    console.print(table)
    examples = data["examples"]
    for group, names in (("different", KINDS), ("failed", FAILURES)):
        for kind in names:
            shown = examples[group][kind][:_SHOWN]
            if shown:
                ids = ", ".join(f"{e['id']} → {e['replay_id']}" for e in shown)
                console.print(f"[dim]{group} ({kind}): {escape(ids)}[/]")
