"""Giving memory back to the system after a large request body.

A body of megabytes leaves glibc's heap grown by several times its size (the bytes, the parsed
document, the rendered prompt, the journal's copy); Python frees the objects but the allocator
keeps the pages, so one large prompt would pin its peak for the life of the process.
`malloc_trim` returns them; it runs in the default executor (ctypes releases the GIL), at most
one at a time, its future kept until it is done. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("smg.memory")

TRIM_AFTER_BYTES = 4 << 20


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_trim = _load_trim()
_pending: set[asyncio.Future[int]] = set()


def release_after(body_bytes: int) -> None:
    """After a request whose body was `body_bytes` long: give freed heap pages back, soon."""
    if _trim is None or body_bytes < TRIM_AFTER_BYTES or _pending:
        return
    future = asyncio.get_running_loop().run_in_executor(None, _trim, 0)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
