"""Giving memory back to the system after a large request body.

A body of megabytes leaves its copies behind (the bytes, the parsed document, the rendered
prompt, the journal's copy, a relayed answer). glibc's dynamic mmap threshold rises to the size
of the largest block freed, so after the first large body the next ones come from the heap,
which gives pages back only at its top: blocks of `TRIM_AFTER_BYTES` and more are kept as
mappings of their own (`mallopt(M_MMAP_THRESHOLD)`, set once at start), returned the moment they
are freed, whoever frees them (the journal writer frees its copies after the request has ended).
Some copies are held by reference cycles, freed only at the next collection of their
generation, which under load may come long after; and glibc keeps the pages of what Python
frees. So after a large body one collection runs (on the event loop:
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
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_libc = _load_libc()
_trim: Callable[[int], int] | None = _libc.malloc_trim if _libc is not None else None
_pending: set[asyncio.Future[int]] = set()
_again = False


def map_large_blocks() -> None:
    """Have every block of `TRIM_AFTER_BYTES` or more mapped on its own (once, at start)."""
    if _libc is not None and not _libc.mallopt(_M_MMAP_THRESHOLD, TRIM_AFTER_BYTES):
        log.info("mallopt(M_MMAP_THRESHOLD) refused: large blocks follow glibc's dynamic threshold")


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
