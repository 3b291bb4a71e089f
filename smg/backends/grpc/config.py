"""The engine connector's settings that `smg launch` exposes (gRPC and ZMQ workers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from smg.flags import option


@dataclass(frozen=True)
class EngineConfig:
    # A worker just added (or just started) is still having its tokenizer fetched and loaded;
    # a request for its model that arrives meanwhile waits for it rather than being turned
    # away, within the request's own deadline. Past this wait it gets the spec's 503.
    tokenizer_wait_secs: float = field(
        default=10.0,
        metadata=option(
            "--tokenizer-wait-secs",
            "A request for a model whose tokenizer is still loading waits this long for it (within its deadline), "
            "then is answered 503 tokenizer_not_ready; 0 answers at once.",
        ),
    )
