"""Fixtures for the fleet's shared state: a real redis-server per test (fresh, in a temp dir,
on a free loopback port), a sync client the test reads it with, and the scripted SGLang engine
of the admission tests (gRPC requests are the ones tenant budgets charge)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.admission.conftest import adm_engine, engine_control
from tools.servers.redis import RedisServer

__all__ = ["adm_engine", "engine_control", "eventually"]


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=True)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy (bounded); returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {value!r})")
        time.sleep(0.05)
