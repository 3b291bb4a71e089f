"""`smg.cli.quick` reads a command line exactly as typer reads it from the same declarations,
and leaves to typer every command line it does not read; the journal's own commands parse
the same both ways."""

from __future__ import annotations

import enum
import inspect
from typing import Annotated, Any

import pytest
from typer.testing import CliRunner

from smg.cli import journal, quick
from smg.cli.params import Argument, Commands, Option


class Shape(enum.Enum):
    round = "round"
    square = "square"


def _group(seen: list[dict[str, Any]]) -> Commands:
    group = Commands(no_args_is_help=True)

    @group.command("pick")
    def pick(
        what: Annotated[str, Argument(help="What.")] = "",
        journal: Annotated[str, Option("--journal", "-j", envvar="QUICK_TEST_JOURNAL", help="Where.")] = "j.db",
        limit: Annotated[int, Option("--limit", "-n", min=1, help="How many.")] = 50,
        every: Annotated[float | None, Option("--every", min=0, help="Seconds.")] = None,
        shape: Annotated[Shape, Option("--as", help="Shape.")] = Shape.round,
        loud: Annotated[bool, Option("--loud", help="Loud.")] = False,
    ) -> None:
        seen.append({"what": what, "journal": journal, "limit": limit, "every": every, "shape": shape, "loud": loud})

    @group.command("two")
    def two(
        left: Annotated[str, Argument(help="Left.")],
        right: Annotated[str, Argument(help="Right.")],
    ) -> None:
        seen.append({"left": left, "right": right})

    return group


READ = [
    ["pick"],
    ["pick", "status:500"],
    ["pick", "-j", "x.db", "--limit", "3", "--as", "square", "--loud", "model:m"],
    ["pick", "--journal=y.db", "--every=0.5", "-n", "7"],
    ["pick", "--", "-not-a-flag"],
    ["pick", "-n", "2", "-n", "9"],
    ["two", "a", "b"],
]
LEFT_TO_TYPER = [
    ["pick", "--help"],
    ["pick", "-n5"],
    ["pick", "--limit", "0"],
    ["pick", "--limit", "many"],
    ["pick", "--as", "oval"],
    ["pick", "--nope"],
    ["pick", "--loud=yes"],
    ["pick", "a", "b"],
    ["pick", "--limit"],
    ["two", "a"],
    ["three"],
]


@pytest.mark.parametrize("argv", READ, ids=" ".join)
def test_a_plain_command_line_is_read_as_typer_reads_it(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUICK_TEST_JOURNAL", "from-env.db")
    quickly: list[dict[str, Any]] = []
    by_typer: list[dict[str, Any]] = []
    assert quick.run(_group(quickly), argv) is True
    result = CliRunner().invoke(_group(by_typer).typer(), argv, env={"QUICK_TEST_JOURNAL": "from-env.db"})
    assert result.exit_code == 0, result.output
    assert quickly == by_typer and len(quickly) == 1


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=" ".join)
def test_anything_else_is_left_to_typer(argv: list[str]) -> None:
    seen: list[dict[str, Any]] = []
    assert quick.run(_group(seen), argv) is False
    assert seen == []


def test_every_journal_command_is_declared_for_both_readers() -> None:
    built = journal.journal_app
    assert sorted(c.name for c in built.registered_commands) == sorted(journal.commands.functions)
    for name, function in journal.commands.functions.items():
        # Each parameter is declared (an Option or an Argument), so quick reads its command lines.
        parameters = inspect.signature(function, eval_str=True).parameters.values()
        required = [p for p in parameters if p.default is inspect.Parameter.empty]
        values = quick._read(function, ["--journal", "x.db", *("a" for _ in required)])
        assert values["journal"] == "x.db" and len(values) == len(parameters), name
