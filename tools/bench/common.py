"""What every bench driver shares: argument parsing helpers, the machine's load, and stopping
the processes a run started (keeping their logs when the run failed)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from tools.spawn import Spawned


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def csv_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def stop_all(started: Sequence[Spawned], workdir: Path, *, failed: bool, console: Console) -> None:
    """Stop what a run started, newest first; keep the logs when it failed, else delete them."""
    for spawned in reversed(started):
        spawned.stop()
    if failed:
        logs = [str(workdir)] + [str(s.log_path) for s in started]
        console.print(f"[yellow]bench failed; logs kept: {', '.join(logs)}[/]", highlight=False)
        return
    shutil.rmtree(workdir, ignore_errors=True)
    for spawned in started:  # spawn() gives each process a log directory of its own
        if spawned.log_path.parent.name.startswith("smg-spawn-"):
            shutil.rmtree(spawned.log_path.parent, ignore_errors=True)
