"""What the gateway asks of an inference engine and what it hears back, in engine-neutral terms.

Each engine protocol (SGLang scheduler, vLLM engine, TensorRT-LLM, TokenSpeed, MLX) maps these
to and from its own protobuf messages in `smg.backends.grpc.engines`; nothing above that layer
sees a protobuf type. What an engine answers (`EngineChunk`, `EngineDone`, `EngineError`) is the
pipeline's vocabulary (`smg.pipeline.engine`), the generation session's input.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from smg.pipeline.constraints import ConstraintKind
from smg.pipeline.engine import EngineChunk, EngineDone, EngineError, EngineEvent
from smg.pipeline.vision import VisionItem

__all__ = [
    "Bootstrap",
    "EncodeBootstrap",
    "EngineChunk",
    "EngineClient",
    "EngineDone",
    "EngineError",
    "EngineEvent",
    "EngineInfo",
    "EngineLoad",
    "GenerateCall",
]


@dataclass(frozen=True)
class Bootstrap:
    """Where a prefill/decode pair meets: the prefill worker's bootstrap server and the room
    that names this request's KV handoff (the same on both legs)."""

    host: str
    port: int
    room: int


@dataclass(frozen=True)
class EncodeBootstrap:
    """Where a prefill worker fetches one image's embedding (EPD): the encode worker's bootstrap
    server and the room that names this item's transfer (the encode worker is told the same)."""

    item_index: int
    host: str
    port: int
    room: int


@dataclass
class GenerateCall:
    """One generation: the prompt as token ids and the sampling settings already resolved
    (request values, else the worker's defaults, else the engine's neutral values)."""

    request_id: str
    input_ids: list[int]
    text: str = ""  # the rendered prompt, for the engine's logs only
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop: list[str] = field(default_factory=list)  # strings the engine matches itself (not SGLang)
    stop_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: list[int] = field(default_factory=list)  # for engines without a tokenizer (ZMQ)
    constraint: tuple[ConstraintKind, str] | None = None
    stream: bool = True
    require_reasoning: bool = False
    # Chunks waiting for the reader may go on as one. Not when the gateway matches stop strings:
    # the usage it reports is the engine's count at the chunk that matched, which a merge would
    # move past the stop.
    merge_chunks: bool = True
    # Disaggregated serving: SGLang's `disaggregated_params`, TokenSpeed's `kv_bootstrap_info`.
    bootstrap: Bootstrap | None = None
    # vLLM's `kv_transfer_params_json`: a JSON object handed to the engine's KV connector verbatim.
    kv_transfer_params: str | None = None
    # The prompt's images, their placeholders already expanded in `input_ids`. EPD legs carry
    # their metadata only: the pixels went to the encode workers.
    images: list[VisionItem] = field(default_factory=list)
    # The same images as the request carried them (decoded or fetched), for TRT-LLM's
    # `multimodal_input.image_data`.
    image_data: list[bytes] = field(default_factory=list)
    send_pixels: bool = True
    encode_bootstrap: list[EncodeBootstrap] = field(default_factory=list)  # the prefill leg's (EPD)
    # `--dp-aware`: the data-parallel rank this leg is pinned to (the worker's `url@rank`), sent
    # as SGLang's, vLLM's and TokenSpeed's `data_parallel_rank`; TRT-LLM and MLX have no field.
    dp_rank: int | None = None




@dataclass
class EngineInfo:
    """What `GetModelInfo` told us about the model an engine serves."""

    model_id: str  # served_model_name, else model_path
    model_path: str = ""
    tokenizer_path: str = ""
    max_context_length: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    vocab_size: int | None = None
    supports_vision: bool = False
    model_type: str = ""
    default_sampling: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RankLoad:
    """One data-parallel rank's share of a `GetLoads` answer."""

    dp_rank: int
    requests: int  # running and waiting
    used_tokens: int  # KV-cache tokens in use


@dataclass(frozen=True)
class EngineLoad:
    """What `GetLoads` says of an engine's work: counts and rates summed over its data-parallel
    ranks, KV-cache use averaged over them (what the reference gateway's load policies score)."""

    running_requests: int
    waiting_requests: int
    # Prompt tokens of waiting requests not served from the prefix cache; 0 when not reported.
    waiting_uncached_tokens: int = 0
    token_usage: float = 0.0  # KV-cache use in [0, 1]
    gen_throughput: float = 0.0  # tokens per second, 0 when not known
    used_tokens: int = 0
    max_total_tokens: int = 0  # KV-cache capacity in tokens, 0 when not reported
    max_running_requests: int = 0
    dp_ranks: int = 1
    ranks: tuple[RankLoad, ...] = ()  # each rank's own counts, for workers pinned to a rank (--dp-aware)

    def rank(self, dp_rank: int | None) -> RankLoad | None:
        """The rank's own counts (None for an unpinned worker or a rank the answer leaves out)."""
        if dp_rank is None:
            return None
        return next((r for r in self.ranks if r.dp_rank == dp_rank), None)


class EngineClient(Protocol):
    """One engine over one channel."""

    runtime: str  # "sglang" | "vllm" | "trtllm" | "tokenspeed" | "mlx"
    target: str  # host:port

    async def health(self) -> bool: ...

    async def model_info(self) -> EngineInfo: ...

    async def server_info(self) -> dict[str, Any]: ...

    async def loads(self) -> EngineLoad | None:
        """The engine's current load, or None when its protocol (TRT-LLM, MLX) or its servicer
        has no `GetLoads`."""
        ...

    def generate(self, call: GenerateCall) -> AsyncIterator[EngineEvent]:
        """Yields chunks then exactly one `EngineDone`; raises `EngineError`. Closing the
        iterator early cancels the RPC (the caller sends `abort` itself)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def tokenizer_bundle(self) -> bytes:
        """The `GetTokenizer` stream's zip bytes, checked against its sha256."""
        ...

    async def close(self) -> None: ...
