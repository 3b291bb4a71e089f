"""The `smg` program: a subcommand that reads the journal starts without importing the gateway.

`smg launch` (and `smg --help`, which lists it) goes through `smg.cli.main`, whose launch
flags need the gateway's settings classes; every other subcommand (`smg.cli.lazy.SUBCOMMANDS`)
runs from a root that knows only it, so `smg journal stats` imports the journal's reader and
views and nothing of the server. A plain `smg journal …` command line does not even import
typer (`smg.cli.quick`): typer's import and its per-parameter pydantic adapters were most of
its start-up.
"""

from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["journal"]:
        from smg.cli import journal, quick

        if quick.run(journal.commands, args[1:]):
            return
    from smg.cli import lazy

    if args and args[0] in lazy.SUBCOMMANDS:
        lazy.root()(args=args, prog_name="smg")
        return
    from smg.cli import main as full

    full.main()
