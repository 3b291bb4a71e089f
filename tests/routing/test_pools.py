"""A pool's identity is a `PoolKey`, and its name is the one name its connector goes by: the
spec's router name, the journal's `backend`."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from smg.backends.http.relay import HttpConnector
from smg.cli.connectors import build_connectors
from smg.config import GatewayConfig
from smg.routing.config import RouterConfig
from smg.routing.pools import ANTHROPIC, GRPC, GRPC_EPD, GRPC_PD, HTTP, HTTP_PD, ZMQ, PoolKey
from smg.routing.router import Router
from smg.routing.workers import Worker


def worker(url: str, role: str = "regular", **kw: object) -> Worker:
    connection = "http" if url.startswith("http") else "grpc"
    return Worker(url=url, connection=connection, role=role, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "role", "epd", "pool"),
    [
        ("grpc://e:1", "regular", False, GRPC),
        ("grpc://e:1", "prefill", False, GRPC_PD),
        ("grpc://e:1", "decode", False, GRPC_PD),
        ("grpc://e:1", "encode", False, GRPC_EPD),
        ("grpc://e:1", "prefill", True, GRPC_EPD),
        ("grpc://e:1", "decode", True, GRPC_EPD),
        ("http://w:1", "regular", False, HTTP),
        ("http://w:1", "decode", False, HTTP_PD),
    ],
)
def test_a_worker_belongs_to_the_pool_of_its_connection_and_role(url: str, role: str, epd: bool, pool: PoolKey) -> None:
    assert PoolKey.of(worker(url, role), epd=epd) == pool


def test_an_external_worker_belongs_to_its_providers_pool() -> None:
    assert PoolKey.of(worker("https://api.anthropic.com", external=True, runtime="anthropic")) == ANTHROPIC


def test_pool_names_are_the_specs_router_names_and_parse_back() -> None:
    names = {key: key.name for key in (GRPC, GRPC_PD, GRPC_EPD, ZMQ, HTTP, HTTP_PD, ANTHROPIC)}
    assert names == {
        GRPC: "grpc",
        GRPC_PD: "grpc-pd",
        GRPC_EPD: "grpc-epd",
        ZMQ: "zmq",
        HTTP: "http",
        HTTP_PD: "http-pd",
        ANTHROPIC: "anthropic",
    }
    assert all(PoolKey.parse(name) == key and str(key) == name for key, name in names.items())


@pytest.mark.parametrize("name", ["pd-grpc", "epd-grpc", "grpc-xyz", ""])
def test_a_name_that_is_no_pool_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a pool name"):
        PoolKey.parse(name)


def test_what_a_pool_serves_a_request_with() -> None:
    assert [k.disaggregated for k in (GRPC, GRPC_PD, GRPC_EPD, HTTP_PD)] == [False, True, True, True]
    assert [k.encodes for k in (GRPC, GRPC_PD, GRPC_EPD, HTTP_PD)] == [False, False, True, False]


def test_a_pool_key_is_a_value() -> None:
    assert PoolKey("grpc", "pd") == GRPC_PD and hash(PoolKey("grpc", "pd")) == hash(GRPC_PD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        GRPC.kind = "http"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (GatewayConfig(router=RouterConfig(igw=True)), [ANTHROPIC, GRPC, GRPC_PD, ZMQ, HTTP, HTTP_PD]),
        (
            GatewayConfig(router=RouterConfig(igw=True, epd=True)),
            [ANTHROPIC, GRPC, GRPC_PD, GRPC_EPD, ZMQ, HTTP, HTTP_PD],
        ),
        (
            GatewayConfig(
                prefill_urls=(("http://p:1", None),), decode_urls=("http://d:1",), router=RouterConfig(pd=True)
            ),
            [HTTP, HTTP_PD],
        ),
        (
            GatewayConfig(
                prefill_urls=(("grpc://p:1", None),), decode_urls=("grpc://d:1",), router=RouterConfig(pd=True)
            ),
            [GRPC, GRPC_PD],
        ),
        (GatewayConfig(worker_urls=("grpc://w:1",)), [GRPC]),
        (GatewayConfig(worker_urls=("https://api.anthropic.com",), backend="anthropic"), [ANTHROPIC]),
    ],
)
def test_every_connector_goes_by_the_name_of_the_pool_it_serves(config: GatewayConfig, expected: list[PoolKey]) -> None:
    async def built() -> dict[PoolKey, str]:
        connectors = build_connectors(config)
        try:
            return {pool: connector.name for pool, connector in connectors.items()}
        finally:
            for connector in connectors.values():
                await connector.close()

    names = asyncio.run(built())
    assert list(names) == expected
    assert all(name == pool.name for pool, name in names.items())


def test_the_router_finds_a_pools_connector_by_its_key_or_its_name() -> None:
    relay = HttpConnector(GatewayConfig())
    router = Router(RouterConfig(pd=True), {"http-pd": relay})
    assert router.connector(HTTP_PD) is relay and router.connector("http-pd") is relay
    assert router.connector(HTTP) is None
