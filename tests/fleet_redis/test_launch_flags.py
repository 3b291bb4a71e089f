"""`smg launch` refuses shared-state settings that cannot work, at start (exit 2), before it
serves anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from smg.cli.main import app, expand_multi_values

runner = CliRunner()
WORKER = ["--worker-urls", "http://127.0.0.1:1"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([*WORKER, "--max-concurrent-requests", "4", "--fleet-concurrency", "http://redis:6379"], "takes a redis://"),
        ([*WORKER, "--fleet-concurrency", "redis://127.0.0.1:1/0"], "needs --max-concurrent-requests"),
        ([*WORKER, "--worker-registry", "redis-host:6379"], "--worker-registry takes a redis:// URL"),
        ([*WORKER, "--redis-failure-mode", "maybe"], "--redis-failure-mode must be one of closed, open"),
        (
            [*WORKER, "--max-concurrent-requests", "4", "--fleet-concurrency", "redis://x/0"]
            + ["--fleet-lease-secs", "0"],
            "--fleet-lease-secs must be at least 1",
        ),
    ],
)
def test_launch_refuses_shared_state_settings_that_cannot_work(args: list[str], needle: str) -> None:
    result = runner.invoke(app, expand_multi_values(["launch", *args]))
    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.output.split()), result.output
