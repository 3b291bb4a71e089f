"""Random ids (`msg_…`, `req_…`): 24 letters and digits from the OS's CSPRNG.

Bytes are drawn from `os.urandom` a page at a time rather than one call per id (two ids per
request were two syscalls), and mapped to the alphabet with one `bytes.translate`. A forked
process drops what it inherited, so two gateway processes (`--workers N`) never share bytes.
"""

from __future__ import annotations

import os
import string

_ALPHABET = (string.ascii_letters + string.digits).encode()
_TO_ALPHABET = bytes(_ALPHABET[b % len(_ALPHABET)] for b in range(256))  # modulo bias is irrelevant for ids
_POOL_BYTES = 4096
_pool = b""
_at = 0


def _forget_pool() -> None:
    global _pool, _at
    _pool, _at = b"", 0


os.register_at_fork(after_in_child=_forget_pool)


def random_id(prefix: str, length: int = 24) -> str:
    """`prefix` and `length` random letters and digits."""
    global _pool, _at
    if _at + length > len(_pool):
        _pool, _at = os.urandom(max(_POOL_BYTES, length)), 0
    raw = _pool[_at : _at + length]
    _at += length
    return prefix + raw.translate(_TO_ALPHABET).decode("ascii")
