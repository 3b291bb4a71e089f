"""Run a command of a `Commands` group from its declarations, without importing typer.

Only the plain command line is taken here: options by their declared flags (`--limit 5`,
`-n 5`, `--limit=5`), flags, positional arguments, `envvar` defaults, `min`/`max` bounds,
enum choices. Anything else (`--help`, an unknown or malformed option, a value out of bounds,
a missing argument, `-n5`) is left to the typer app, which answers it as it always has: a
command line read here means exactly what typer would have read.
"""

from __future__ import annotations

import enum
import inspect
import os
import sys
import types
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin

from smg.cli.params import Argument, Commands, Option, declared


class _Unread(Exception):
    """This command line is typer's to read."""


def run(commands: Commands, argv: list[str]) -> bool:
    """Run `argv` (a command's name, then its arguments); False, having done nothing, when
    the command line is not a plain one."""
    if not argv or argv[0] not in commands.functions or "--help" in argv:
        return False
    function = commands.functions[argv[0]]
    try:
        values = _read(function, argv[1:])
    except _Unread:
        return False
    try:
        function(**values)
        sys.stdout.flush()
    except BrokenPipeError:
        # As click does for a reader that went away (`smg journal ls | head`): quiet, exit 1.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("\nAborted!", file=sys.stderr)
        raise SystemExit(1) from None
    return True


def _read(function: Callable[..., Any], args: list[str]) -> dict[str, Any]:
    flags: dict[str, tuple[str, Any, Option]] = {}
    positional: list[tuple[str, Any, Argument]] = []
    values: dict[str, Any] = {}
    for parameter in inspect.signature(function, eval_str=True).parameters.values():
        kind, declaration = declared(parameter.annotation)
        if isinstance(declaration, Option):
            for flag in declaration.decls:
                flags[flag] = (parameter.name, kind, declaration)
        elif isinstance(declaration, Argument):
            positional.append((parameter.name, kind, declaration))
        else:
            raise _Unread
        if parameter.default is not inspect.Parameter.empty:
            values[parameter.name] = parameter.default
    given: set[str] = set()
    rest = iter(args)
    arguments = iter(positional)
    only_positional = False
    for arg in rest:
        if not only_positional and arg == "--":
            only_positional = True
            continue
        if not only_positional and arg.startswith("-") and arg != "-":
            flag, eq, inline = arg.partition("=")
            if flag not in flags:
                raise _Unread
            name, kind, option = flags[flag]
            if kind is bool:
                if eq:
                    raise _Unread
                values[name] = True
            else:
                text = inline if eq else next(rest, None)
                if text is None:
                    raise _Unread
                values[name] = _convert(text, kind, option.settings)
            given.add(name)
            continue
        entry = next(arguments, None)
        if entry is None:
            raise _Unread
        name, kind, argument = entry
        values[name] = _convert(arg, kind, argument.settings)
        given.add(name)
    for name, kind, option in flags.values():
        envvar = option.settings.get("envvar")
        if name not in given and isinstance(envvar, str) and os.environ.get(envvar):
            values[name] = _convert(os.environ[envvar], kind, option.settings)
    if any(name not in values for name, _, _ in positional) or any(n not in values for n, _, _ in flags.values()):
        raise _Unread  # a required value is missing: typer says which
    return values


def _convert(text: str, kind: Any, settings: dict[str, Any]) -> Any:
    if get_origin(kind) in (Union, types.UnionType):
        kinds = [k for k in get_args(kind) if k is not type(None)]
        if len(kinds) != 1:
            raise _Unread
        kind = kinds[0]
    try:
        if kind is str:
            return text
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return kind(text)
        if kind is int or kind is float:
            number = kind(text)
        else:
            raise _Unread
    except ValueError:
        raise _Unread from None
    low, high = settings.get("min"), settings.get("max")
    if (low is not None and number < low) or (high is not None and number > high):
        raise _Unread
    return number
