"""How a settings field names its command-line flag: `field(default=…, metadata=option(…))`.

Every `smg launch` setting is declared here once, on the settings field it fills: the gateway's
own (`smg.config.GatewayConfig`), the launching process's (`smg.config.ProcessConfig`) and
each component's; `smg.cli.options` turns them into `smg launch` options and reads the parsed
values back. This module imports nothing, so any layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def option(
    flag: str,
    help: str,
    *,
    invert: bool = False,
    choices: tuple[str, ...] = (),
    aliases: tuple[str, ...] = (),
    envvar: str | None = None,
    takes: str | None = None,
    parse: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """The `metadata` of a settings field that `smg launch` exposes as `flag`.

    `invert`: a `--disable-…` switch that sets the (boolean) field False. `aliases`: other names
    of the flag (the reference's). `envvar`: read when the flag is not given. `takes`: what the
    flag takes when it is not the field's type (`"str"`, `"list[str]"`), and `parse` turns that
    into the field's value (raising `ValueError` with a message naming the flag)."""
    return {
        "flag": flag,
        "help": help,
        "invert": invert,
        "choices": choices,
        "aliases": aliases,
        "envvar": envvar,
        "takes": takes,
        "parse": parse,
    }
