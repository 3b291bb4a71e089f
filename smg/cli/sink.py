"""`smg journal-sink init URL`: create (or upgrade) the fleet journal's schema in a PostgreSQL database.

A gateway started with `--journal-sink` upgrades an older schema but never creates one in a
database that has none (see `smg.journal_sink`): creating it is this command's, run once.
"""

from __future__ import annotations

from typing import Annotated

import typer

sink_app = typer.Typer(help="The fleet journal in PostgreSQL (see --journal-sink).", no_args_is_help=True)


@sink_app.command("init")
def init(
    url: Annotated[str, typer.Argument(help="postgresql://user:password@host:port/database")],
) -> None:
    """Create the fleet journal's tables in the database, or bring them to this version."""
    import psycopg

    from journal.pg import partitions, schema
    from journal.pg.shipper import connect, display

    try:
        with connect(url) as conn:
            before = schema.version(conn)
            after = schema.migrate(conn)
            partitions.ensure(conn, partitions.ahead())
    except (psycopg.Error, schema.SchemaTooNew) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        typer.echo(f"smg journal-sink init: {display(url)}: {text}", err=True)
        raise typer.Exit(2) from None
    if before == after:
        typer.echo(f"{display(url)}: the fleet journal's schema is at version {after}")
    else:
        typer.echo(f"{display(url)}: the fleet journal's schema migrated from version {before} to {after}")
