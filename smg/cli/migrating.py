"""The progress of a journal migration that counts every request (the rollups'), as `smg
launch` opens the journal: a progress bar on a terminal, a line at the start and at the end
otherwise (a service's log)."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any


class MigrationProgress:
    """`journal.schema.Progress` for one opening of the journal; a context manager that ends
    the bar. Nothing is shown unless a migration reports progress."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._progress: Any = None
        self._task: Any = None
        self._started = 0.0
        self._total = 0

    def __call__(self, done: int, total: int) -> None:
        if self._progress is None:
            self._start(total)
        self._total = total
        if self._task is not None:
            self._progress.update(self._task, completed=done, total=total)

    def _start(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self._started = time.monotonic()
        self._progress = Progress(
            TextColumn(f"migrating {self.path}: counting the rollups"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        if not console.is_terminal:
            print(f"smg: migrating {self.path}: counting {total:,} requests into the rollups", file=sys.stderr)
        self._progress.start()
        self._task = self._progress.add_task("migrate", total=total)

    def __enter__(self) -> MigrationProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is None:
            return
        self._progress.stop()
        if kind is None:
            elapsed = time.monotonic() - self._started
            print(f"smg: migrated {self.path}: {self._total:,} requests counted in {elapsed:.1f}s", file=sys.stderr)
