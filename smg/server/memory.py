"""Giving memory back to the system after a large request body.

A body of megabytes leaves its copies behind (the bytes, the parsed document, the rendered
prompt, the journal's copy, a relayed answer). Some are held by reference cycles, freed only at
the next collection of their generation, which under load may come long after; and glibc keeps
the pages of what Python frees. So after a large body one collection runs (on the event loop:
finalizers may touch it; start-up's objects are frozen out of its sight, so it walks only what
requests allocated) and then `malloc_trim` returns the free pages, in the default executor
(ctypes releases the GIL). At most one release is in flight, its future kept until it is done;
a large body that ends meanwhile asks for one more after it, so the last body of a burst is
given back too. Elsewhere than glibc only the collection runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
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
_again = False


def release_after(body_bytes: int) -> None:
    """After a request whose body was `body_bytes` long: give its memory back, soon."""
    global _again
    if body_bytes < TRIM_AFTER_BYTES:
        return
    if _pending:
        _again = True
        return
    _release(asyncio.get_running_loop())


def _release(loop: asyncio.AbstractEventLoop) -> None:
    global _again
    _again = False
    gc.collect()
    if _trim is None:
        return
    future = loop.run_in_executor(None, _trim, 0)
    _pending.add(future)
    future.add_done_callback(lambda done: _finished(loop, done))


def _finished(loop: asyncio.AbstractEventLoop, future: asyncio.Future[int]) -> None:
    _pending.discard(future)
    if _again and not loop.is_closed():
        _release(loop)
