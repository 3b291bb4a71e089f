"""A pool's identity: the connection its workers speak and how they serve a request together.

The router groups a model's workers into pools and hands each pool's requests to one connector;
a pool's name (`grpc`, `grpc-pd`, `grpc-epd`, `http`, `http-pd`, `zmq`, or an external provider
such as `anthropic`) is the spec's router name and the name its connector journals as `backend`,
reports in metrics and is charged by in the budget gate: one name per pool, everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from smg.routing.workers import Worker

Mode = Literal["regular", "pd", "epd"]
_MODES: tuple[str, ...] = get_args(Mode)


@dataclass(frozen=True, order=True)
class PoolKey:
    """`kind`: the workers' connection (`grpc`, `http`, `zmq`), or the external provider they are
    (`anthropic`); `mode`: one worker per request (`regular`), a prefill/decode pair (`pd`), or
    an encode/prefill/decode triple (`epd`)."""

    kind: str
    mode: Mode = "regular"

    @classmethod
    def of(cls, worker: Worker, epd: bool = False) -> PoolKey:
        """The pool a worker belongs to (`epd`: the gateway serves encode/prefill/decode
        deployments, so its prefill and decode workers pair with encode workers)."""
        if worker.external:
            return cls(worker.runtime or "")
        if worker.role == "regular":
            return cls(worker.connection)
        if worker.role == "encode" or (epd and worker.role in ("prefill", "decode")):
            return cls(worker.connection, "epd")
        return cls(worker.connection, "pd")

    @classmethod
    def parse(cls, name: str) -> PoolKey:
        """The key a pool's name stands for (`grpc-pd` → `PoolKey("grpc", "pd")`)."""
        kind, _, mode = name.partition("-")
        if not kind or (mode and mode not in _MODES[1:]):
            raise ValueError(f"not a pool name: {name!r}")
        return cls(kind, mode or "regular")  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return self.kind if self.mode == "regular" else f"{self.kind}-{self.mode}"

    @property
    def disaggregated(self) -> bool:
        """Whether the pool's requests are served by prefill/decode pairs (and, EPD, encoders)."""
        return self.mode != "regular"

    @property
    def encodes(self) -> bool:
        """Whether the pool's requests have an encode leg too (EPD)."""
        return self.mode == "epd"

    def __str__(self) -> str:
        return self.name


GRPC = PoolKey("grpc")
GRPC_PD = PoolKey("grpc", "pd")
GRPC_EPD = PoolKey("grpc", "epd")
ZMQ = PoolKey("zmq")
HTTP = PoolKey("http")
HTTP_PD = PoolKey("http", "pd")
ANTHROPIC = PoolKey("anthropic")
