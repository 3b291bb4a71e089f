"""Which threads run a given function: for tests that work must happen off the event loop."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any


@contextmanager
def threads_calling(code: CodeType) -> Iterator[set[int]]:
    """The idents of the threads that call the function of `code` inside the block: this one,
    and the threads started meanwhile (`threading.setprofile` reaches new threads only, so an
    executor's threads must be started inside the block too)."""
    seen: set[int] = set()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            seen.add(threading.get_ident())

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
