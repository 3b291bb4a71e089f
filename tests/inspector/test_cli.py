"""`smg inspect` on the command line: its options, and a missing journal as a clean error."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from typer.testing import CliRunner

from replay.inspector import InspectorApp
from smg.cli.main import app


def test_inspect_runs_the_app_on_the_journal(sample_journal: Path) -> None:
    with mock.patch.object(InspectorApp, "run", autospec=True) as run:
        result = CliRunner().invoke(app, ["inspect", "--journal", str(sample_journal), "--page-size", "7"])
    assert result.exit_code == 0, result.output
    (inspector,) = run.call_args.args
    assert isinstance(inspector, InspectorApp)
    assert inspector.journal_path == str(sample_journal)
    assert inspector.source.page_size == 7


def test_inspect_without_a_journal_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", "--journal", str(tmp_path / "missing.db")])
    assert result.exit_code == 1
    assert "no journal at" in result.output
