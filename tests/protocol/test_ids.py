"""Random ids: their shape, and a forked process never repeating its parent's."""

from __future__ import annotations

import os
import string

from smg.protocol.ids import random_id


def test_ids_are_the_prefix_and_24_letters_or_digits_and_do_not_repeat() -> None:
    ids = [random_id("msg_") for _ in range(20_000)]  # several refills of the byte pool
    assert len(set(ids)) == len(ids)
    alphabet = set(string.ascii_letters + string.digits)
    assert all(i.startswith("msg_") and len(i) == 28 and set(i[4:]) <= alphabet for i in ids)
    assert len({c for i in ids for c in i[4:]}) == 62


def test_a_forked_process_draws_its_own_bytes() -> None:
    random_id("req_")  # the pool holds unused bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, random_id("req_").encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert child != random_id("req_")
