"""What every engine protocol client shares: the channel, error conversion, and turning a
Generate stream into `EngineChunk`s and one `EngineDone`.

The five protocols differ in their message names and in what their numbers mean, but not in
shape: a server stream of `chunk`s (new token ids) ending in one `complete`. Each engine module
reads its messages into `RawChunk` / `RawComplete` and says whether its chunk counts are
per-chunk deltas (vLLM) or running totals (SGLang, TRT-LLM, TokenSpeed, MLX); `_Tally` does the
rest, so the counts and token ids the gateway sees mean the same whatever the engine.
`GetLoads`, where a protocol has it (SGLang, vLLM, TokenSpeed), is read here too: the three
spell its per-rank core metrics alike.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar, cast

import grpc
import grpc.aio
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from smg_grpc_proto.generated import common_pb2

from smg.backends.grpc import wire
from smg.backends.grpc.types import (
    EngineChunk,
    EngineDone,
    EngineError,
    EngineEvent,
    EngineInfo,
    EngineLoad,
    GenerateCall,
    RankLoad,
)
from smg.observability import tracing

MiB = 1024 * 1024
# Large messages: tokenizer bundles and long prompts' token ids. No client keepalive pings: a
# Python servicer keeps grpc-core's server ping policy, which answers pings during a long
# prefill (no data flowing) with GOAWAY and would kill the stream.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 256 * MiB),
    ("grpc.max_send_message_length", 256 * MiB),
]
MAX_BUNDLE_BYTES = 200 * MiB  # as the Rust gateway's tokenizer_bundle.rs
MAX_MERGED = 256  # engine chunks handled as one at most, when they are already waiting
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def engine_load(response: Any) -> EngineLoad:
    """A `GetLoadsResponse` (SGLang, vLLM and TokenSpeed name its core fields alike), summed over
    its ranks; the KV-cache use is their mean, as the reference gateway's policies take it."""
    ranks = list(response.loads)
    return EngineLoad(
        running_requests=sum(r.num_running_reqs for r in ranks),
        waiting_requests=sum(r.num_waiting_reqs for r in ranks),
        waiting_uncached_tokens=sum(r.num_waiting_uncached_tokens for r in ranks),
        token_usage=sum(r.token_usage for r in ranks) / len(ranks) if ranks else 0.0,
        gen_throughput=sum(r.gen_throughput for r in ranks),
        used_tokens=sum(r.num_used_tokens for r in ranks),
        max_total_tokens=sum(r.max_total_num_tokens for r in ranks),
        max_running_requests=sum(r.max_running_requests for r in ranks),
        dp_ranks=len(ranks),
        ranks=tuple(
            RankLoad(r.dp_rank, r.num_running_reqs + r.num_waiting_reqs, r.num_used_tokens) for r in ranks
        ),
    )


def engine_error(exc: grpc.aio.AioRpcError) -> EngineError:
    """The gRPC status as an `EngineError` named by its status code."""
    code = exc.code()
    name = code.name if isinstance(code, grpc.StatusCode) else str(code)
    return EngineError(name, str(exc.details() or ""))


def strip_scheme(target: str) -> str:
    """`grpc://host:port` → `host:port` (worker URLs carry the scheme, channels do not)."""
    for scheme in ("grpc://", "grpcs://"):
        if target.startswith(scheme):
            return target[len(scheme) :].rstrip("/")
    return target.rstrip("/")


def parse_json_object(text: str) -> dict[str, Any]:
    """A JSON object field of a model info answer; empty or malformed reads as no values."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def sampling_defaults(default_json: str, preferred_json: str = "") -> dict[str, Any]:
    """`default_sampling_params_json`, else the sampling keys of `preferred_sampling_params`.

    SGLang's servicer already merges its preferred params into the default JSON; an older one
    sends only the preferred params.
    """
    defaults = parse_json_object(default_json)
    if defaults:
        return defaults
    preferred = parse_json_object(preferred_json)
    return {key: preferred[key] for key in SAMPLING_DEFAULT_KEYS if preferred.get(key) is not None}


def common_sampling(call: GenerateCall) -> dict[str, Any]:
    """The `SamplingParams` fields SGLang, vLLM and TokenSpeed name and default alike: the call's
    values, else the neutral ones (penalties off, one sequence, special tokens skipped, EOS kept
    as a stop). `top_k` is left out: its neutral value differs (-1, or vLLM's 0)."""
    return {
        "temperature": call.temperature if call.temperature is not None else 1.0,
        "top_p": call.top_p if call.top_p is not None else 1.0,
        "min_p": call.min_p or 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": call.repetition_penalty if call.repetition_penalty is not None else 1.0,
        "stop_token_ids": call.stop_token_ids,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "ignore_eos": False,
        "n": 1,
    }


def model_info(
    *,
    model_path: str = "",
    served_model_name: str = "",
    tokenizer_path: str = "",
    max_context_length: int = 0,
    eos_token_ids: list[int] | None = None,
    vocab_size: int = 0,
    supports_vision: bool = False,
    model_type: str = "",
    default_sampling: dict[str, Any] | None = None,
) -> EngineInfo:
    """An `EngineInfo` from model info fields, zero and empty values read as not told."""
    return EngineInfo(
        model_id=served_model_name or model_path,
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        max_context_length=max_context_length if max_context_length > 0 else None,
        eos_token_ids=[int(t) for t in eos_token_ids or []],
        vocab_size=vocab_size if vocab_size > 0 else None,
        supports_vision=supports_vision,
        model_type=model_type,
        default_sampling=default_sampling or {},
    )


@dataclass
class RawChunk:
    """A `chunk` message, read into engine-neutral names (counts still as the engine meant them)."""

    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class RawComplete:
    """A `complete` message, read into engine-neutral names."""

    output_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    matched_token_id: int | None = None
    matched_stop_str: str | None = None
    kv_transfer_params: str | None = None


@dataclass
class _Tally:
    """What the chunks of one stream delivered so far, to make the counts running totals and to
    tell which ids of the `complete` are new."""

    delta_counts: bool
    input_len: int
    delivered: list[int] = field(default_factory=list)
    completion: int = 0
    prompt: int = 0
    cached: int = 0

    def chunk(self, raw: RawChunk) -> EngineChunk | None:
        self.delivered.extend(raw.token_ids)
        if self.delta_counts:
            self.completion += len(raw.token_ids)
        else:
            # TokenSpeed counts a trimmed stop token that no chunk carries: trust its total.
            self.completion = max(raw.completion_tokens, self.completion + len(raw.token_ids))
        self.prompt = raw.prompt_tokens or self.prompt
        self.cached = raw.cached_tokens or self.cached
        if not raw.token_ids:
            return None
        return EngineChunk(
            token_ids=list(raw.token_ids),
            prompt_tokens=self.prompt or self.input_len,
            completion_tokens=self.completion,
            cached_tokens=self.cached,
        )

    def done(self, raw: RawComplete) -> EngineDone:
        new_ids = self._undelivered(raw.output_ids)
        # vLLM's streamed `complete` counts only its last delta, so the chunks' total is the
        # larger one there; everywhere else the engine's total is at least the chunks'.
        total = max(raw.completion_tokens, self.completion, len(self.delivered) + len(new_ids))
        return EngineDone(
            finish_reason=raw.finish_reason or "stop",
            prompt_tokens=raw.prompt_tokens or self.prompt or self.input_len,
            completion_tokens=total,
            token_ids=new_ids,
            matched_token_id=raw.matched_token_id,
            matched_stop_str=raw.matched_stop_str,
            cached_tokens=raw.cached_tokens or self.cached,
            kv_transfer_params=raw.kv_transfer_params,
        )

    def ended_without_complete(self) -> EngineDone:
        """MLX ends an aborted stream with no `complete`: what was delivered is all there is."""
        return EngineDone(
            finish_reason="abort",
            prompt_tokens=self.prompt or self.input_len,
            completion_tokens=max(self.completion, len(self.delivered)),
            cached_tokens=self.cached,
        )

    def _undelivered(self, output_ids: list[int]) -> list[int]:
        # A `complete` carries either every output id (non-streaming; TRT-LLM always) or, in
        # SGLang / vLLM / TokenSpeed streams, a repeat of the last chunk's ids (MLX: none).
        # Only ids extending what the chunks delivered are new.
        if not self.delivered:
            return list(output_ids)
        n = len(self.delivered)
        if len(output_ids) > n and list(output_ids[:n]) == self.delivered:
            return list(output_ids[n:])
        return []


class GrpcEngineClient(ABC):
    """One engine over one `grpc.aio` channel, opened on first use in the running loop."""

    runtime: str = ""
    # The protocol's generated messages module: every engine names its requests alike.
    pb: ClassVar[ModuleType]
    # Whether the engine's chunk `completion_tokens` counts that chunk only (vLLM).
    delta_counts: bool = False
    # Whether the protocol has `GetLoads` (SGLang, vLLM, TokenSpeed; not TRT-LLM or MLX).
    has_loads: bool = False
    # The `complete` message's field of generated ids (TRT-LLM's is `output_token_ids`).
    output_ids_field: str = "output_ids"

    def __init__(
        self, target: str, *, timeout: float = 10.0, bundle_timeout: float = 120.0, merge_waiting: bool = True
    ) -> None:
        self.target = strip_scheme(target)
        self.merge_waiting = merge_waiting
        self.timeout = timeout
        self.bundle_timeout = bundle_timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._wire: wire.Channel | None = None

    # -- per-protocol hooks -------------------------------------------------------------------

    @abstractmethod
    def _make_stub(self, channel: grpc.aio.Channel) -> Any: ...

    def _health_request(self) -> Any:
        return self.pb.HealthCheckRequest()

    def _healthy(self, response: Any) -> bool:
        return bool(response.healthy)

    def _model_info_request(self) -> Any:
        return self.pb.GetModelInfoRequest()

    def _engine_info(self, response: Any) -> EngineInfo:
        """`GetModelInfo` as SGLang, vLLM and TokenSpeed spell it (the others override)."""
        return model_info(
            model_path=response.model_path,
            served_model_name=response.served_model_name,
            tokenizer_path=response.tokenizer_path,
            max_context_length=response.max_context_length,
            eos_token_ids=list(response.eos_token_ids),
            vocab_size=response.vocab_size,
            supports_vision=response.supports_vision,
            model_type=response.model_type,
            # Only SGLang also has the older `preferred_sampling_params`.
            default_sampling=sampling_defaults(
                response.default_sampling_params_json, getattr(response, "preferred_sampling_params", "")
            ),
        )

    def _server_info_request(self) -> Any:
        return self.pb.GetServerInfoRequest()

    @abstractmethod
    def _abort_request(self, request_id: str) -> Any: ...

    @abstractmethod
    def generate_request(self, call: GenerateCall) -> Any:
        """The engine's `GenerateRequest` for `call` (public so tests can read the mapping)."""

    def _read(self, response: Any) -> RawChunk | RawComplete | None:
        """A `GenerateResponse` as SGLang, vLLM, TokenSpeed and TRT-LLM spell it (MLX overrides)."""
        which = response.WhichOneof("response")
        if which == "chunk":
            c = response.chunk
            return RawChunk(list(c.token_ids), c.prompt_tokens, c.completion_tokens, c.cached_tokens)
        if which == "complete":
            c = response.complete
            token_id, stop_str = matched_stop(c)
            return RawComplete(
                output_ids=list(getattr(c, self.output_ids_field)),
                finish_reason=c.finish_reason,
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                cached_tokens=c.cached_tokens,
                matched_token_id=token_id,
                matched_stop_str=stop_str,
            )
        return None

    # -- EngineClient ------------------------------------------------------------------------

    def stub(self) -> Any:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
            self._stub = self._make_stub(self._channel)
        return self._stub

    async def _unary(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self.stub(), method)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise engine_error(exc) from None

    async def health(self) -> bool:
        return self._healthy(await self._unary("HealthCheck", self._health_request()))

    async def model_info(self) -> EngineInfo:
        return self._engine_info(await self._unary("GetModelInfo", self._model_info_request()))

    async def server_info(self) -> dict[str, Any]:
        response = await self._unary("GetServerInfo", self._server_info_request())
        return cast(dict[str, Any], MessageToDict(response, preserving_proto_field_name=True))

    async def abort(self, request_id: str) -> None:
        await self._unary("Abort", self._abort_request(request_id))

    async def loads(self) -> EngineLoad | None:
        if not self.has_loads:
            return None
        try:
            response = await self._unary("GetLoads", self.pb.GetLoadsRequest(include=["core"]))
        except EngineError as exc:
            if exc.code == "UNIMPLEMENTED":  # a servicer older than the protocol's GetLoads
                return None
            raise
        return engine_load(response)

    def health_call(self, channel: grpc.aio.Channel, timeout: float) -> Any:
        """This protocol's `HealthCheck` on `channel`, not the client's own: runtime detection
        asks one channel in every protocol in turn."""
        return self._make_stub(channel).HealthCheck(self._health_request(), timeout=timeout)

    async def generate(self, call: GenerateCall) -> AsyncIterator[EngineEvent]:
        # Generate goes over `wire` (HTTP/2 on asyncio), not `grpc.aio`: a fifth of the CPU
        # per streamed message (tools/bench/grpc_read.py). The request's trace continues on
        # the engine (W3C trace context as gRPC metadata).
        path, parse = _generate_method(type(self))
        if self._wire is None:
            self._wire = wire.Channel(self.target, connect_timeout=self.timeout)
        if call.image_data or (call.images and call.send_pixels):
            # Tens of MB of pixels or image bytes to copy into the message: not on the event
            # loop, where every other stream would wait for it.
            request = await asyncio.to_thread(lambda: self.generate_request(call).SerializeToString())
        else:
            request = self.generate_request(call).SerializeToString()
        stream = await self._wire.stream(path, request, tracing.grpc_metadata() or ())
        tally = _Tally(delta_counts=self.delta_counts, input_len=len(call.input_ids))
        done: EngineDone | None = None
        read, waiting = stream.read, stream.read_nowait
        most = MAX_MERGED if self.merge_waiting and call.merge_chunks else 1
        try:
            while (message := await read()) is not None:
                raw = self._read(parse(message))
                if done is not None or raw is None:
                    continue  # n = 1: nothing follows the `complete` but the status
                if not isinstance(raw, RawChunk):
                    done = tally.done(raw)
                    continue
                chunk = tally.chunk(raw)
                # Chunks that are already here when the gateway gets to this one (it fell behind
                # the engine) go on as one: one pass through the pipeline, one journal event, one
                # SSE frame for all of them. Nothing waits for more.
                merged = 1
                while merged < most and (more := waiting()) is not None:
                    raw = self._read(parse(more))
                    if raw is None:
                        continue
                    if not isinstance(raw, RawChunk):
                        done = tally.done(raw)
                        break
                    merged += 1
                    following = tally.chunk(raw)
                    if following is None:
                        continue
                    if chunk is None:
                        chunk = following
                    else:
                        chunk.token_ids += following.token_ids
                        chunk.prompt_tokens = following.prompt_tokens
                        chunk.completion_tokens = following.completion_tokens
                        chunk.cached_tokens = following.cached_tokens
                if chunk is not None:
                    yield chunk
            # The status is in: the `complete` is final and nothing is left to cancel.
            yield done if done is not None else tally.ended_without_complete()
        except DecodeError as exc:
            raise EngineError("INTERNAL", f"the engine sent a message that does not parse: {exc}") from None
        finally:
            if not stream.ended:
                stream.cancel()

    async def tokenizer_bundle(self) -> bytes:
        data = bytearray()
        digest = ""
        chunks = 0
        rpc = self.stub().GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=self.bundle_timeout)
        try:
            async for chunk in rpc:
                chunks += 1
                data.extend(chunk.data)
                if len(data) > MAX_BUNDLE_BYTES:
                    raise EngineError("RESOURCE_EXHAUSTED", f"tokenizer bundle exceeds {MAX_BUNDLE_BYTES} bytes")
                digest = chunk.sha256 or ""
        except grpc.aio.AioRpcError as exc:
            raise engine_error(exc) from None
        finally:
            if not rpc.done():
                rpc.cancel()
        if not chunks or not data:
            raise EngineError("DATA_LOSS", "the tokenizer bundle stream was empty")
        if not digest:
            raise EngineError("DATA_LOSS", "the tokenizer bundle stream ended without its sha256")
        actual = hashlib.sha256(data).hexdigest()
        if actual.lower() != digest.strip().lower():
            raise EngineError("DATA_LOSS", f"tokenizer bundle sha256 mismatch: got {actual}, engine said {digest}")
        return bytes(data)

    async def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
            self._wire = None
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"


@functools.cache
def _generate_method(client: type[GrpcEngineClient]) -> tuple[str, Callable[[bytes], Any]]:
    return wire.method_path(client.pb, "Generate")


def matched_stop(complete: Any) -> tuple[int | None, str | None]:
    """The `matched_stop` oneof of a `complete` as (token id, string)."""
    which = complete.WhichOneof("matched_stop")
    if which == "matched_token_id":
        return int(complete.matched_token_id), None
    if which == "matched_stop_str":
        return None, str(complete.matched_stop_str)
    return None, None
