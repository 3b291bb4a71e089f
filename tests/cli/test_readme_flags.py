"""The README documents the `smg` program as the code declares it: every command, every flag
and alias (a `smg launch` flag in a table row, a subcommand's in its command's section), the
defaults its rows state, no row for a flag that is gone, every file path it names and every
make target."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from smg.cli.main import _SETTINGS, app
from smg.cli.options import flagged

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# The README section that documents each group's commands (a heading's start).
SECTIONS = {
    "smg journal": "### `smg journal`",
    "smg replay": "### `smg replay`",
    "smg inspect": "### `smg inspect`",
    "smg engine": "### `smg engine llamacpp`",
    "smg journal-sink": "### The fleet journal (PostgreSQL)",
}
# Options every command has that the program documents once, not per command.
_PROGRAM_OPTIONS = {"--help", "--install-completion", "--show-completion"}


def _commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """Every runnable command under `command` (the lazy subcommands loaded), with its full name."""
    if not hasattr(command, "list_commands"):
        yield " ".join(path), command
        return
    ctx = type(command).context_class(command)
    for name in command.list_commands(ctx):
        yield from _commands(command.get_command(ctx, name), (*path, name))


COMMANDS = dict(_commands(typer.main.get_command(app), ("smg",)))


def _options(command: Any) -> list[list[str]]:
    """Each option of `command` as the names it answers to."""
    return [
        [*p.opts, *p.secondary_opts]
        for p in command.params
        if p.param_type_name == "option" and not set(p.opts) & _PROGRAM_OPTIONS
    ]


def _section(heading: str) -> str:
    """The README from `heading` to the next heading of the same or a higher level."""
    start = README.index("\n" + heading) + 1
    level = len(heading) - len(heading.lstrip("#"))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(README, start + len(heading))
    return README[start : end.start() if end else len(README)]


@dataclass(frozen=True)
class Row:
    heading: str
    cells: list[str]


def _table_rows() -> list[Row]:
    """The rows of the README's flag and command tables (header `Flag` or `Command`)."""
    rows: list[Row] = []
    heading, header = "", ""
    for line in README.splitlines():
        if line.startswith("#"):
            heading = line
        if not line.startswith("|"):
            header = ""
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if not header:
            header = cells[0]
        elif header in ("Flag", "Command") and not set(cells[0]) <= set("-: "):
            rows.append(Row(heading, cells))
    return rows


ROWS = _table_rows()
_FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def test_every_make_target_is_in_the_readme() -> None:
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert phony is not None
    missing = [t for t in phony.group(1).split() if not re.search(rf"make {re.escape(t)}(?![\w-])", README)]
    assert not missing, f"make targets the README does not name: {missing}"


def _launch_rows() -> list[Row]:
    return [r for r in ROWS if r.cells[0].startswith("`-") and not r.heading.startswith(SECTIONS["smg engine"])]


def test_every_command_is_named_in_the_readme() -> None:
    missing = [name for name in COMMANDS if not re.search(re.escape(name) + r"(?![\w-])", README)]
    assert not missing, f"commands the README never names: {missing}"


def test_every_launch_flag_and_alias_has_a_row() -> None:
    in_rows = {flag for r in _launch_rows() for flag in _FLAG.findall(r.cells[0])}
    declared = [
        name for cls in _SETTINGS for f in flagged(cls) for name in (f.metadata["flag"], *f.metadata["aliases"])
    ]
    missing = [name for name in declared if name not in in_rows]
    assert not missing, f"`smg launch` flags without a README row: {missing}"
    rows = "\n".join(" | ".join(r.cells) for r in _launch_rows())
    envvars = [f.metadata["envvar"] for cls in _SETTINGS for f in flagged(cls) if f.metadata["envvar"]]
    unnamed = [v for v in envvars if f"${v}" not in rows]
    assert not unnamed, f"environment variables of `smg launch` flags their rows do not name: {unnamed}"


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "smg launch"])
def test_every_subcommand_option_is_in_its_commands_section(name: str) -> None:
    group = next(g for g in SECTIONS if name == g or name.startswith(g + " "))
    section = _section(SECTIONS[group])
    # The section's prose and this command's own rows: an option another command's row names
    # does not document this one.
    prose = "\n".join(line for line in section.splitlines() if not line.startswith("|"))
    own = [" | ".join(r.cells) for r in ROWS if r.heading.startswith(SECTIONS[group]) and _row_command(r) == name]
    text = "\n".join([prose, *own])
    missing = [
        opt
        for names in _options(COMMANDS[name])
        for opt in names
        if not re.search(rf"`[^`]*(?<![\w-]){re.escape(opt)}(?![\w-])", text)
    ]
    assert not missing, f"{name}: options its README section ({SECTIONS[group]}) does not name: {missing}"
    envvars = [v for p in COMMANDS[name].params for v in ([p.envvar] if isinstance(p.envvar, str) else p.envvar or [])]
    unnamed = [v for v in envvars if f"${v}" not in text]
    assert not unnamed, f"{name}: environment variables its README section does not name: {unnamed}"


def _row_command(row: Row) -> str:
    """The command a table row documents a flag of."""
    first = row.cells[0]
    if first.startswith("`smg "):
        words = first.strip("`").split()
        return next(n for n in sorted(COMMANDS, key=len, reverse=True) if " ".join(words[: n.count(" ") + 1]) == n)
    for group, heading in SECTIONS.items():
        if row.heading.startswith(heading):
            return next(n for n in COMMANDS if n.startswith(group + " ")) if group not in COMMANDS else group
    return "smg launch"


def test_every_flag_a_row_names_exists() -> None:
    gone = []
    for row in ROWS:
        command = _row_command(row)
        # The engine section's one table serves both engine commands.
        commands = [c for n, c in COMMANDS.items() if n.startswith("smg engine")] if "engine" in command else []
        known = {opt for c in [COMMANDS[command], *commands] for names in _options(c) for opt in names}
        gone += [f"{command}: {flag}" for flag in _FLAG.findall(row.cells[0]) if flag not in known]
    assert not gone, f"README rows naming flags that do not exist: {gone}"


# Flags of other programs the README shows in commands: vLLM's (a ZMQ engine dialling the gateway), pip's.
_OTHER_PROGRAMS = {
    "--headless",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-size",
    "--data-parallel-size-local",
    "--no-deps",
}


def test_every_flag_the_readme_names_anywhere_exists() -> None:
    """Prose too: a flag is one of `smg`'s, refused by name (`NOT_YET`), a tool's or another program's."""
    from smg.cli.main import NOT_YET

    tools = {
        flag
        for source in (ROOT / "tools").rglob("*.py")
        for flag in re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source.read_text(encoding="utf-8"))
    }
    known = {o for c in COMMANDS.values() for names in _options(c) for o in names} | set(NOT_YET) | tools
    # `--retry-*` is a family of flags, not one.
    named = {f for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", README) if not f.endswith("-")}
    unknown = sorted(named - known - _OTHER_PROGRAMS)
    assert not unknown, f"flags the README names that nothing declares: {unknown}"


def _number(text: str) -> float | None:
    text = text.replace(",", "")
    power = re.fullmatch(r"(\d+)([⁰¹²³⁴⁵⁶⁷⁸⁹]+)", text)
    if power:
        exponent = int(power.group(2).translate(str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")))
        return float(int(power.group(1)) ** exponent)
    try:
        return float(text)
    except ValueError:
        return None


def _launch_defaults() -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for cls in _SETTINGS:
        for f in flagged(cls):
            if not f.metadata.get("takes"):
                defaults[f.metadata["flag"]] = cls.__dataclass_fields__[f.name].default
    return defaults


def _stated_defaults() -> Iterator[tuple[str, str, str]]:
    """(command, flag, the default its row states) for each row that states one per flag."""
    for row in ROWS:
        if not row.cells[0].startswith("`-") or len(row.cells) < 3:
            continue
        flags = re.findall(r"`(--[\w-]+)", re.sub(r"\(`[^)]*\)", "", row.cells[0]))  # aliases left out
        stated = [s.strip() for s in re.split(r",\s+(?![^(]*\))", row.cells[1])]
        if len(flags) != len(stated):
            continue
        yield from ((_row_command(row), flag, text) for flag, text in zip(flags, stated, strict=True))


def test_the_defaults_the_rows_state_are_the_codes() -> None:
    code = {"smg launch": _launch_defaults()}
    for name, command in COMMANDS.items():
        if name != "smg launch":
            code[name] = {p.opts[0]: p.default for p in command.params if p.param_type_name == "option"}
    wrong = []
    checked = 0
    for command, flag, text in _stated_defaults():
        defaults = code[command]
        if command.startswith("smg engine"):
            defaults = {k: v for n, d in code.items() if n.startswith("smg engine") for k, v in d.items()}
        if flag not in defaults:
            continue
        default = defaults[flag]
        literal = re.match(r"`([^`]*)`", text)
        value = literal.group(1) if literal else text.split(" ")[0]
        if isinstance(default, bool):
            expected = "off" if default is False or flag.startswith(("--disable-", "--no-")) else "on"
            ok = value == expected
        elif isinstance(default, int | float) and _number(value) is not None:
            ok = math.isclose(float(default), _number(value) or 0.0)
        elif isinstance(default, (str, Path)) and literal:
            ok = value.removeprefix("./") == str(default)
        elif isinstance(default, tuple) and len(default) == 1 and literal:
            ok = value == default[0]
        else:
            continue
        checked += 1
        if not ok:
            wrong.append(f"{command} {flag}: README {text!r}, code {default!r}")
    assert checked > 50, f"only {checked} stated defaults were compared: the rows' format changed"
    assert not wrong, "README defaults that are not the code's:\n" + "\n".join(wrong)


_TOP = ("smg", "journal", "replay", "tools", "tests", "docs")
_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(_TOP)})/[\w./-]*\w/?)(?:::([\w.]+))?")
# Dotted names the README gives that are not modules: a logger.
_NOT_MODULES = {"smg.access"}
_MODULE = re.compile(r"`((?:smg|journal|replay|tools)(?:\.[a-z_][\w]*)+)`")


def _module_file(parts: list[str]) -> Path | None:
    """The file of module `a.b.c` (`parts`) in the tree, if it is one."""
    base = ROOT.joinpath(*parts)
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


def test_every_path_the_readme_names_exists() -> None:
    missing = []
    for path, symbol in _PATH.findall(README):
        target = ROOT / path
        if not target.exists():
            missing.append(path)
        elif symbol and not re.search(rf"\b{re.escape(symbol.split('.')[0])}\b", target.read_text(encoding="utf-8")):
            missing.append(f"{path}::{symbol}")
    for dotted in _MODULE.findall(README):
        parts = dotted.split(".")
        if dotted in _NOT_MODULES:
            continue
        depth = max((i for i in range(1, len(parts) + 1) if _module_file(parts[:i])), default=0)
        module = _module_file(parts[:depth]) if depth else None
        rest = parts[depth:]
        if module is None or (rest and not re.search(rf"\b{re.escape(rest[0])}\b", module.read_text(encoding="utf-8"))):
            missing.append(dotted)
    sources = {f.name for top in _TOP[:-1] for f in (ROOT / top).rglob("*.py")}
    missing += [name for name in re.findall(r"`(\w+\.py)`", README) if name not in sources]
    assert not missing, f"paths and modules the README names that do not exist: {missing}"
