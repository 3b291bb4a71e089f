"""`smg inspect`: the terminal inspector over a journal (read-only; safe next to a running gateway)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from journal.reader import JournalError
from journal.schema import DEFAULT_PATH, ENV_VAR


def inspect_command(
    journal: Annotated[
        str,
        typer.Option(
            "--journal",
            "-j",
            envvar=ENV_VAR,
            help=f"Journal file or postgresql:// URL (the fleet journal); default ${ENV_VAR}, else ./{DEFAULT_PATH}.",
        ),
    ] = DEFAULT_PATH,
    page_size: Annotated[int, typer.Option(help="Requests loaded per page.", min=1)] = 100,
    refresh: Annotated[float, typer.Option(help="Seconds between looks for new requests (0: never).", min=0)] = 1.0,
    base_url: Annotated[
        str | None, typer.Option(help="The gateway URL exported curl commands target (default: 127.0.0.1:30000).")
    ] = None,
) -> None:
    """Browse the journal: a live request list with a query filter, and each request's timeline,
    request, response, tokens and errors; replay, diff, export as curl."""
    from replay.inspector import InspectorApp

    try:
        app = InspectorApp(journal, page_size=page_size, refresh_s=refresh, base_url=base_url)
    except JournalError as exc:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    app.run()
