"""The `smg` subcommands other than `launch`, imported only when one runs.

`smg journal stats` must not pay for what `smg launch` needs (the server framework, gRPC,
the protocol models, the tokenizer libraries), nor `smg launch` for the journal's views: a
subcommand's module is imported when the command line names it (or help lists it), and the
click command it becomes is exactly the one `add_typer`/`command` would have made, so every
command, flag, help text and error reads as before. `smg.cli.entry` runs them without
importing `smg.cli.main` at all.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperGroup
from typer.main import get_command

HELP = "smg: an Anthropic Messages API gateway with an event-sourced request journal."
"""The `smg` command's own help line."""

SUBCOMMANDS: dict[str, tuple[str, str, bool]] = {
    # name: (module, attribute, a group of commands rather than one)
    "replay": ("smg.cli.replay", "replay", False),
    "inspect": ("smg.cli.inspect", "inspect_command", False),
    "journal": ("smg.cli.journal", "journal_app", True),
    "engine": ("smg.cli.engine", "engine_app", True),
    "journal-sink": ("smg.cli.sink", "sink_app", True),
}
"""Every lazily imported subcommand; commands are listed before groups, as typer lists them."""


def load(name: str) -> Any:
    """The click command of subcommand `name` (as `typer.main.get_command` builds it), imported now."""
    module, attribute, group = SUBCOMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer(add_completion=False)  # completion options belong to the program only
    if group:
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
        holder.callback()(_nothing)  # a group of one, so the command is built as a subcommand
    built: Any = get_command(holder)
    return built.commands[name]


def _nothing() -> None:
    pass


class LazyCommands(TyperGroup):
    """The `smg` group: its own commands (`launch`) and `SUBCOMMANDS`, each loaded on first use."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in SUBCOMMANDS:
            command = self.commands[cmd_name] = load(cmd_name)
        return command

    def list_commands(self, ctx: Any) -> list[str]:
        own = [name for name in self.commands if name not in SUBCOMMANDS]
        return [
            *(name for name, (_, _, group) in SUBCOMMANDS.items() if not group),
            *own,
            *(name for name, (_, _, group) in SUBCOMMANDS.items() if group),
        ]

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and self.get_command(ctx, args[0]) is None:
            for name in SUBCOMMANDS:  # an unknown name: suggestions come from every command
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


def root() -> typer.Typer:
    """The `smg` app with the lazy subcommands only (`smg.cli.main.app` adds `launch`)."""
    app = typer.Typer(cls=LazyCommands, help=HELP, no_args_is_help=True)
    app.callback()(_nothing)  # a group, whatever else is registered
    return app
