"""Which connector serves each pool, and when the gateway builds one: one table, in the order the
connectors are built (a pair's connector shares the engines, tokenizers or client of the one
its legs speak, built before it).

Without IGW only the pools the configured workers make are served (`--backend anthropic`: the
Anthropic connector alone); IGW serves every pool, since any worker may be added at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smg.backends.anthropic import AnthropicConnector
from smg.backends.base import Connector
from smg.backends.http.pd import HttpPdConnector
from smg.backends.http.relay import HttpConnector
from smg.config import GatewayConfig
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.routing.pools import ANTHROPIC, GRPC, GRPC_EPD, GRPC_PD, HTTP, HTTP_PD, ZMQ, PoolKey
from smg.routing.workers import Connection, worker_kind

if TYPE_CHECKING:
    from smg.backends.grpc.backend import EngineConnector


@dataclass
class Deployment:
    """What the settings deploy: the kinds of the workers and of the disaggregated legs, the
    modes, and the connectors built so far (by pool)."""

    config: GatewayConfig
    kinds: set[Connection]
    legs: set[Connection]
    # gRPC and ZMQ engines serving one model share its tokenizer.
    tokenizers: TokenizerRegistry
    built: dict[PoolKey, Connector] = field(default_factory=dict)

    @classmethod
    def of(cls, config: GatewayConfig) -> Deployment:
        legs = [*(u for u, _ in (*config.prefill_urls, *config.encode_urls)), *config.decode_urls]
        return cls(
            config=config,
            kinds={worker_kind(u) for u in config.worker_urls},
            legs={worker_kind(u) for u in legs},
            tokenizers=TokenizerRegistry(autoload=config.tokenizer_autoload, cache=config.engine.tokenizer_cache()),
        )

    @property
    def igw(self) -> bool:
        return self.config.router.igw

    @property
    def anthropic(self) -> bool:
        return self.config.backend == "anthropic"

    @property
    def pd(self) -> bool:
        return self.config.router.pd

    @property
    def epd(self) -> bool:
        return self.config.router.epd

    def engine(self) -> EngineConnector:
        from smg.backends.grpc.backend import EngineConnector

        connector = self.built[GRPC]
        assert isinstance(connector, EngineConnector)
        return connector

    def relay(self) -> HttpConnector:
        connector = self.built[HTTP]
        assert isinstance(connector, HttpConnector)
        return connector


@dataclass(frozen=True)
class Serves:
    """A pool's connector: whether the deployment needs it, and how it is made."""

    pool: PoolKey
    needed: Callable[[Deployment], bool]
    make: Callable[[Deployment], Connector]


# The engine connectors are imported only when a deployment has engine workers: gRPC and the engine
# pipeline would cost a relay's start-up their import time.
def _engine(d: Deployment) -> Connector:
    from smg.backends.grpc.backend import EngineConnector

    return EngineConnector(d.config, d.tokenizers)


def _grpc_pair(roles: tuple[str, ...]) -> Callable[[Deployment], Connector]:
    def make(d: Deployment) -> Connector:
        from smg.backends.grpc.pd import GrpcPdConnector

        return GrpcPdConnector(d.engine(), roles=roles)

    return make


def _zmq(d: Deployment) -> Connector:
    from smg.backends.zmq.connector import zmq_connector

    return zmq_connector(d.config, d.tokenizers)


CONNECTORS: tuple[Serves, ...] = (
    Serves(ANTHROPIC, lambda d: d.igw or d.anthropic, lambda d: AnthropicConnector(d.config)),
    Serves(
        GRPC,
        lambda d: d.igw or (d.kinds == {"grpc"} and not d.anthropic) or "grpc" in d.legs,
        _engine,
    ),
    # The pairs' connectors share the engines (and tokenizers) of the gRPC connector.
    Serves(GRPC_PD, lambda d: GRPC in d.built and (d.igw or (d.pd and "grpc" in d.legs)),
           _grpc_pair(("prefill", "decode"))),
    Serves(GRPC_EPD, lambda d: GRPC in d.built and d.epd,
           _grpc_pair(("encode", "prefill", "decode"))),
    Serves(ZMQ, lambda d: d.igw or (d.kinds == {"zmq"} and not d.anthropic),
           _zmq),
    Serves(
        HTTP,
        lambda d: d.igw or ("http" in d.kinds and not d.anthropic) or (d.pd and "grpc" not in d.legs),
        lambda d: HttpConnector(d.config),
    ),
    Serves(HTTP_PD, lambda d: HTTP in d.built and (d.igw or d.pd), lambda d: HttpPdConnector(d.config, d.relay())),
)  # fmt: skip


def build_connectors(config: GatewayConfig) -> dict[PoolKey, Connector]:
    """The connector of every pool the gateway serves under `config`."""
    deployment = Deployment.of(config)
    for row in CONNECTORS:
        if row.needed(deployment):
            deployment.built[row.pool] = row.make(deployment)
    return deployment.built
