"""How a settings field names its command-line flag: `field(default=…, metadata=option(…))`.

The settings dataclasses of each component declare their flags here, once; `smg.cli.options`
turns them into `smg launch` options. This module imports nothing, so any layer may use it.
"""

from __future__ import annotations

from typing import Any


def option(flag: str, help: str, *, invert: bool = False, choices: tuple[str, ...] = ()) -> dict[str, Any]:
    """The `metadata` of a settings field that `smg launch` exposes as `flag`. `invert`: a
    `--disable-…` switch that sets the (boolean) field False."""
    return {"flag": flag, "help": help, "invert": invert, "choices": choices}
