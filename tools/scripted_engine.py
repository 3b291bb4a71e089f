"""A scripted gRPC inference engine: one of the five engine protocols, answered as a test says.

It serves the chosen runtime's service (SGLang scheduler, vLLM engine, TensorRT-LLM,
TokenSpeed scheduler or MLX engine: `Generate`, `HealthCheck`, `Abort`, `GetModelInfo`,
`GetServerInfo`, `GetTokenizer`) with that protocol's own semantics, and next to it, on the same
port, a control service `tools.ScriptedEngine` whose unary methods take and return JSON bytes:

- `Script` `{"scripts": [Script, ...], "default": Script?}` queues scripts; each `Generate` takes
  the first queued one whose condition matches (see `when_prompt_contains`), else the default
  one (else the text below);
- `Received` → `{"requests": [...]}`: every `GenerateRequest`, as `MessageToDict` dicts, in order
  (bytes fields base64, so a TRT-LLM request's `multimodal_input.image_data` shows the images'
  bytes as they arrived);
- `Aborts` → `{"request_ids": [...]}`: the ids named by `Abort` calls, in order;
- `Cancelled` → `{"request_ids": [...]}`: the `Generate` calls the client cancelled, in order;
- `TraceContext` → `{"metadata": [...]}`: each `Generate` call's `traceparent`/`tracestate` metadata;
- `Release` lets streams waiting at `hold_after` go on; `SetHealth` `{"healthy": bool}`;
- `Reset` clears scripts, records and health and releases held streams.

Where the protocol has `GetLoads` (SGLang, vLLM, TokenSpeed) it tells the truth about the
streams in flight: each `Generate` not yet finished (held ones included) is a running request,
and its prompt plus the tokens sent so far are used KV tokens, out of a fixed 65,536-token cache;
nothing ever waits and the throughput is not measured (0).

A Script is a JSON object (all keys optional) in the one script format, which the playback
engine's parser checks (`smg.backends.grpc.engines.playback.Script`; this engine adds `delay_ms`):
`text` (encoded with the model's tokenizer, no special tokens) or `token_ids`; `eos` (default
true: the first EOS id follows the text, so the engine stops on it); `chunk_size` (tokens per
chunk, default 1); `finish_reason` and `matched_stop` (int or str) override what the engine
would report; `prompt_tokens` (default the prompt's length), `cached_tokens`; `delay_ms`
between chunks; `hold_after` (after that many tokens, wait for `Release`); `error`
`{"code": "INVALID_ARGUMENT", "message": str, "after_tokens": int}` fails the RPC with that
status once that many tokens were sent; `exit_after` (a token count) ends the engine process at
once when that many were sent (after a `hold_after` pause, if both are given), as a crashed engine
ends: its streams break mid-answer. Without `text` and `token_ids` the text is the default
one, "Hello! I am the scripted engine, answering over gRPC."

Two keys make a queued script a rule rather than a one-off, for clients (agents) that send side
requests in an order a test does not want to pin: `when_prompt_contains` (a string) makes the
script match only a `Generate` whose prompt, decoded with special tokens kept (so
`<|im_start|>`, `<tool_response>` and the like can be matched), contains it — a script without
it matches any prompt; `repeat` (default false) keeps the script queued after it is used, so it
answers every matching `Generate`. Each `Generate` scans the queue in order and takes the first
match; no match falls back to the default. Both keys are ignored in `default`.

What each runtime does with a script, as its real servicer does (smg-grpc-servicer 0.14.1, the
TensorRT-LLM servicer, smg-project/smg `crates/grpc_client`):

- the engine stops at `max tokens` ("length"), a `stop_token_ids` hit or an EOS id unless
  `ignore_eos` ("stop", `matched_token_id`), or a stop string in the decoded text ("stop",
  `matched_stop_str`; not MLX, which has none);
- SGLang: chunks carry new ids and running totals; the streamed `complete` repeats the last
  chunk's ids; stop and EOS tokens stay in the ids and are named as matched;
- vLLM: each chunk's `completion_tokens` counts that chunk; the streamed `complete` repeats the
  last chunk's ids and count; the primary EOS (the first id) stops without a `matched_token_id`
  (vLLM folds only the other EOS ids into its stop ids);
- TensorRT-LLM: running totals; the `complete` carries every id; stop and EOS tokens are left out
  of the ids and the counts; health is the status "OK";
- TokenSpeed: as SGLang, but a matched stop token is trimmed from the ids (still counted);
- MLX: running totals; the streamed `complete` carries no ids;
- `Abort` ends an in-flight stream of that id with a `complete` whose finish reason is "abort"
  (vLLM first sends an empty chunk, as it does).

A prompt longer than the context window or an empty one fails with `INVALID_ARGUMENT`, as vLLM
answers.

`--dp-size N` makes it an engine of N data-parallel ranks: `GetServerInfo` says so (SGLang's and
TokenSpeed's `server_args.dp_size`, vLLM's `data_parallel_size`), a `Generate` pinned by its
`data_parallel_rank` runs on that rank (an unpinned one on rank 0; a rank out of range fails with
`INVALID_ARGUMENT`), and `GetLoads` reports each rank's own streams. `Received` keeps every
request's `data_parallel_rank` as it was sent.

`--role` makes it one leg of a disaggregated deployment, as the real servicers behave there:

- `prefill` / `decode` (SGLang, TokenSpeed): a request without its rendezvous (SGLang's
  `disaggregated_params` with a `bootstrap_room`, TokenSpeed's `kv_bootstrap_info`) fails with
  `INVALID_ARGUMENT` "Disaggregated request received without bootstrap room id"; a prefill leg
  produces one token, then its `complete`;
- `prefill` (vLLM): a request tagged `do_remote_decode` in `kv_transfer_params_json` completes
  with the handoff for the decode leg in its own `kv_transfer_params_json`
  (`do_remote_prefill`, `remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port`,
  `remote_request_id`); `GetServerInfo` names `--kv-connector` (default NixlConnector) and an
  engine id; a decode leg is any engine told `--role decode` (it reads what it is given);
- `encode` (TokenSpeed): serves `TokenSpeedEncoder.Encode` beside the scheduler service (which
  discovery and health checks use, as the real encode worker does); `Generate` fails with
  `FAILED_PRECONDITION`. `Encoded` → `{"requests": [...]}` gives the `EncodeRequest`s;
  `EncodeFailure` `{"code": "INVALID_ARGUMENT", "message": "..."}` fails the next `Encode` with
  that status (`{"accepted": false}`: answers it not accepted). A TokenSpeed prefill leg given
  image items without their pixels needs `encode_bootstrap_info` naming each item, else it fails
  `INVALID_ARGUMENT`, as the real prefill has nowhere to get the embeddings from.

`GetTokenizer` streams a zip of the tokenizer files of `--model-path` (the servicers' file list)
in 64 KiB chunks, the sha256 on the last one.

Run: ``python -m tools.scripted_engine --port P --runtime sglang --model-path DIR
[--host 127.0.0.1] [--served-model-name NAME] [--reported-model-path PATH] [--max-context-length N]
[--no-tokenizer-bundle] [--eos-token-ids 1,2] [--default-sampling-params JSON]
[--role regular|prefill|decode|encode] [--kv-connector NAME] [--dp-size N]``. It prints a line starting with
``scripted engine ready`` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import signal
import sys
import time
import zipfile
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, Self

import grpc
import grpc.aio
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from smg_grpc_proto.generated import (
    common_pb2,
    mlx_engine_pb2,
    mlx_engine_pb2_grpc,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_encoder_pb2,
    tokenspeed_encoder_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    trtllm_service_pb2,
    trtllm_service_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from smg.backends.grpc.engines.playback import DEFAULT_TEXT
from smg.backends.grpc.engines.playback import Script as PlaybackScript

RUNTIMES = ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")
ROLES = ("regular", "prefill", "decode", "encode")
NO_ROOM = "Disaggregated request received without bootstrap room id"
# Where each runtime carries a prefill/decode rendezvous (vLLM carries KV params instead).
_RENDEZVOUS_FIELD = {"sglang": "disaggregated_params", "tokenspeed": "kv_bootstrap_info"}
CONTROL_SERVICE = "tools.ScriptedEngine"
READY_LINE = "scripted engine ready"
BUNDLE_CHUNK_BYTES = 64 * 1024
# The files smg_grpc_servicer/tokenizer_bundle.py puts in the bundle, flat at the zip's root.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
TOKENIZER_GLOBS = ("*.tiktoken", "*.jinja", "*.model")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
KV_CACHE_TOKENS = 65536  # what GetServerInfo and GetLoads report as the token capacity
MAX_RUNNING_REQUESTS = 128
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    # Without this a second server binds the same port silently and a spawn retry never happens.
    ("grpc.so_reuseport", 0),
]


class ScriptError(ValueError):
    """A control request the engine cannot accept; answered with `INVALID_ARGUMENT`."""


# --- scripts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Script(PlaybackScript):
    """A script in the one format (`smg.backends.grpc.engines.playback.Script`, whose parser
    checks it), plus this engine's own `delay_ms` between chunks, kept in seconds."""

    delay: float = 0.0

    @classmethod
    def parse(cls, raw: Any, *, extra_keys: frozenset[str] = frozenset()) -> Self:
        script = super().parse(raw, extra_keys=extra_keys | {"delay_ms"})
        delay = raw.get("delay_ms", 0)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise ScriptError("delay_ms must be a non-negative number")
        return replace(script, delay=float(delay) / 1000.0)


def exit_now(why: str) -> NoReturn:
    """The engine process ends at once, as a crashed engine does: no answer, no goodbye, its
    connections cut mid-stream."""
    print(f"scripted engine exits: {why}", flush=True)
    os._exit(3)


# --- the model -----------------------------------------------------------------------------------


@dataclass
class Model:
    """What the engine serves: the model directory, its tokenizer and what it says about itself."""

    path: Path
    reported_path: str  # the model path GetModelInfo / GetServerInfo tell
    served_name: str
    tokenizer: Any
    max_context_length: int
    eos_token_ids: list[int]
    vocab_size: int
    model_type: str
    architectures: list[str]
    bos_token_id: int
    pad_token_id: int
    default_sampling: dict[str, Any]
    bundle_enabled: bool
    kv_connector: str = ""  # vLLM GetServerInfo: the engine's KV connector ("" when not disaggregated)
    kv_role: str = ""
    kv_engine_id: str = ""
    hold_tokenizer: bool = False  # GetTokenizer answers only after a Release
    dp_size: int = 1  # data-parallel ranks GetServerInfo and GetLoads report
    _bundle: tuple[bytes, str] | None = None

    @classmethod
    def load(cls, args: argparse.Namespace) -> Model:
        from transformers import AutoTokenizer

        path = Path(args.model_path).resolve()
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        config = _read_json(path / "config.json")
        generation = _read_json(path / "generation_config.json")
        if args.eos_token_ids:
            eos = [int(t) for t in args.eos_token_ids.split(",") if t.strip()]
        else:
            eos = _ids(generation.get("eos_token_id")) or _ids(config.get("eos_token_id"))
            if not eos and tokenizer.eos_token_id is not None:
                eos = [int(tokenizer.eos_token_id)]
        defaults = {key: generation[key] for key in SAMPLING_KEYS if generation.get(key) is not None}
        if args.default_sampling_params:
            defaults.update(json.loads(args.default_sampling_params))
        reported = args.reported_model_path or str(path)
        role = getattr(args, "role", "regular")
        pd = role in ("prefill", "decode")
        connector = getattr(args, "kv_connector", None)
        connector = connector if connector is not None else ("NixlConnector" if pd else "")
        return cls(
            path=path,
            reported_path=reported,
            served_name=args.served_model_name or reported,
            tokenizer=tokenizer,
            max_context_length=args.max_context_length or int(config.get("max_position_embeddings") or 4096),
            eos_token_ids=eos,
            vocab_size=int(config.get("vocab_size") or len(tokenizer)),
            model_type=str(config.get("model_type") or ""),
            architectures=[str(a) for a in config.get("architectures") or []],
            bos_token_id=_first(config.get("bos_token_id"), generation.get("bos_token_id")),
            pad_token_id=_first(config.get("pad_token_id"), generation.get("pad_token_id")),
            default_sampling=defaults,
            bundle_enabled=not args.no_tokenizer_bundle,
            kv_connector=connector,
            kv_role={"prefill": "kv_producer", "decode": "kv_consumer"}.get(role, "") if connector else "",
            kv_engine_id=f"scripted-{role}-{args.port}" if connector else "",
            hold_tokenizer=args.hold_tokenizer,
            dp_size=getattr(args, "dp_size", 1),
        )

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def decode_prompt(self, token_ids: list[int]) -> str:
        """The prompt as text, special tokens kept (what `when_prompt_contains` is matched against)."""
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    @property
    def default_sampling_json(self) -> str:
        return json.dumps(self.default_sampling, separators=(",", ":")) if self.default_sampling else ""

    def bundle(self) -> tuple[bytes, str]:
        """The tokenizer zip and its sha256 hex digest, built once."""
        if self._bundle is None:
            buffer = io.BytesIO()
            added: set[str] = set()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                candidates = [self.path / name for name in TOKENIZER_FILES]
                for pattern in TOKENIZER_GLOBS:
                    candidates.extend(sorted(self.path.glob(pattern)))
                for file in candidates:
                    if file.is_file() and file.name not in added:
                        archive.write(file, file.name)
                        added.add(file.name)
            data = buffer.getvalue()
            self._bundle = (data, hashlib.sha256(data).hexdigest())
        return self._bundle


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int)]
    return []


def _first(*values: Any) -> int:
    for value in values:
        if isinstance(value, int):
            return value
    return 0


# --- what a Generate call asks and what the engine makes of it ----------------------------------


@dataclass
class Asked:
    """The parts of a `GenerateRequest` the scripted engine acts on, whatever the runtime."""

    request_id: str
    input_ids: list[int]
    stream: bool
    max_tokens: int | None
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool = False
    keep_stop_token: bool = False


@dataclass
class Plan:
    """The generation a script and a request make: every token, how it ends, what is trimmed."""

    generated: list[int]
    finish_reason: str
    matched_token_id: int | None
    matched_stop_str: str | None
    trim_last: bool
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Semantics:
    """How a runtime's servicer reports a generation."""

    chunk_counts: str  # "total" (running total) or "delta" (this chunk's tokens)
    stream_complete_ids: str  # "last" (repeat the last chunk), "all" or "none"
    trims_stop_token: bool = False  # leaves a matched stop token out of the ids
    counts_trimmed: bool = False  # ... but counts it
    names_primary_eos: bool = True  # reports the first EOS id as matched_token_id
    string_stops: bool = True
    string_stop_beats_length: bool = False
    skips_empty_chunks: bool = False
    empty_chunk_on_abort: bool = False


SEMANTICS = {
    "sglang": Semantics(chunk_counts="total", stream_complete_ids="last"),
    "vllm": Semantics(
        chunk_counts="delta",
        stream_complete_ids="last",
        names_primary_eos=False,
        string_stop_beats_length=True,
        empty_chunk_on_abort=True,
    ),
    "trtllm": Semantics(
        chunk_counts="total",
        stream_complete_ids="all",
        trims_stop_token=True,
        names_primary_eos=False,
        string_stop_beats_length=True,
        skips_empty_chunks=True,
    ),
    "tokenspeed": Semantics(
        chunk_counts="total",
        stream_complete_ids="last",
        trims_stop_token=True,
        counts_trimmed=True,
        skips_empty_chunks=True,
    ),
    "mlx": Semantics(chunk_counts="total", stream_complete_ids="none", string_stops=False),
}


def make_plan(script: Script, asked: Asked, model: Model, semantics: Semantics) -> Plan:
    """Walk the scripted tokens as the engine would generate them, deciding where it stops."""
    if script.token_ids is not None:
        tokens = list(script.token_ids)
    else:
        tokens = model.encode(script.text if script.text is not None else DEFAULT_TEXT)
    if script.eos and model.eos_token_ids:
        tokens.append(model.eos_token_ids[0])
    stop_ids = set(asked.stop_token_ids)
    eos_ids = set() if asked.ignore_eos else set(model.eos_token_ids)
    stops = [s for s in asked.stop if s] if semantics.string_stops else []

    generated: list[int] = []
    finish, matched_id, matched_str, token_stop = "stop", None, None, False
    limit = asked.max_tokens
    if limit is not None and limit <= 0:
        finish = "length"
        tokens = []
    for token in tokens:
        generated.append(token)
        hit_str = next((s for s in stops if s in model.decode(generated)), None) if stops else None
        at_limit = limit is not None and len(generated) >= limit
        if at_limit and not (hit_str and semantics.string_stop_beats_length):
            finish = "length"
            break
        if token in stop_ids or token in eos_ids:
            token_stop = True
            primary_eos = token not in stop_ids and token == model.eos_token_ids[0]
            matched_id = None if primary_eos and not semantics.names_primary_eos else token
            break
        if hit_str is not None:
            matched_str = hit_str
            break
    trim_last = token_stop and semantics.trims_stop_token and not asked.keep_stop_token
    if script.finish_reason is not None:
        finish = script.finish_reason
    if isinstance(script.matched_stop, str):
        matched_id, matched_str = None, script.matched_stop
    elif script.matched_stop is not None:
        matched_id, matched_str = script.matched_stop, None
    return Plan(
        generated=generated,
        finish_reason=finish,
        matched_token_id=matched_id,
        matched_stop_str=matched_str,
        trim_last=trim_last,
        prompt_tokens=script.prompt_tokens if script.prompt_tokens is not None else len(asked.input_ids),
        cached_tokens=script.cached_tokens,
    )


# --- the per-runtime wire formats ----------------------------------------------------------------


@dataclass
class Ending:
    """The fields of a `complete` message."""

    output_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    matched_token_id: int | None = None
    matched_stop_str: str | None = None


class Wire:
    """One runtime's messages: how to read its requests and write its answers."""

    pb: Any
    servicer_base: type
    add_to_server: Callable[[Any, Any], None]
    ids_field = "output_ids"  # the `complete` message's field of generated ids

    def asked(self, request: Any) -> Asked:
        raise NotImplementedError

    def response(self, request_id: str, **part: Any) -> Any:
        """A `GenerateResponse`, echoing the request id where the protocol has the field."""
        if "request_id" in self.pb.GenerateResponse.DESCRIPTOR.fields_by_name:
            part["request_id"] = request_id
        return self.pb.GenerateResponse(**part)

    def chunk(self, request_id: str, token_ids: list[int], prompt: int, completion: int, cached: int) -> Any:
        return self.response(
            request_id,
            chunk=self.pb.GenerateStreamChunk(
                token_ids=token_ids, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached
            ),
        )

    def complete(self, request_id: str, end: Ending) -> Any:
        complete = self.pb.GenerateComplete(
            **{self.ids_field: end.output_ids},
            finish_reason=end.finish_reason,
            prompt_tokens=end.prompt_tokens,
            completion_tokens=end.completion_tokens,
            cached_tokens=end.cached_tokens,
        )
        if end.matched_token_id is not None:
            complete.matched_token_id = end.matched_token_id
        elif end.matched_stop_str is not None:
            complete.matched_stop_str = end.matched_stop_str
        return self.response(request_id, complete=complete)

    def health(self, healthy: bool) -> Any:
        return self.pb.HealthCheckResponse(healthy=healthy, message="Health" if healthy else "set unhealthy by a test")

    def abort_ids(self, request: Any) -> list[str]:
        return [str(request.request_id)]

    def abort_response(self, known: bool) -> Any:
        return self.pb.AbortResponse(success=known, message="aborted" if known else "not found")

    def model_info(self, model: Model) -> Any:
        raise NotImplementedError

    def server_info(self, model: Model, active: int, uptime: float) -> Any:
        raise NotImplementedError

    @property
    def has_loads(self) -> bool:
        return hasattr(self.pb, "GetLoadsResponse")

    def loads(self, ranks: dict[int, tuple[int, int]]) -> Any:
        """A `GetLoadsResponse` with one load per rank, from each rank's (running requests, used
        tokens) (SGLang, vLLM and TokenSpeed name the fields alike)."""
        loads = [
            self.pb.SchedulerLoad(
                dp_rank=rank,
                num_running_reqs=running,
                num_waiting_reqs=0,
                num_total_reqs=running,
                num_used_tokens=used_tokens,
                max_total_num_tokens=KV_CACHE_TOKENS,
                token_usage=used_tokens / KV_CACHE_TOKENS,
                utilization=running / MAX_RUNNING_REQUESTS,
                max_running_requests=MAX_RUNNING_REQUESTS,
            )
            for rank, (running, used_tokens) in sorted(ranks.items())
        ]
        response = self.pb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            version="scripted",
            dp_rank_count=len(loads),
            loads=loads,
        )
        if "aggregate" in self.pb.GetLoadsResponse.DESCRIPTOR.fields_by_name and loads:
            running = sum(r for r, _ in ranks.values())
            response.aggregate.CopyFrom(
                self.pb.AggregateMetrics(
                    total_running_reqs=running,
                    total_waiting_reqs=0,
                    total_reqs=running,
                    avg_token_usage=sum(load.token_usage for load in loads) / len(loads),
                    avg_utilization=sum(load.utilization for load in loads) / len(loads),
                )
            )
        return response


def pinned_rank(request: Any) -> int | None:
    """The `data_parallel_rank` a `GenerateRequest` is pinned to (None: not pinned, or a protocol
    without the field)."""
    if "data_parallel_rank" not in request.DESCRIPTOR.fields_by_name or not request.HasField("data_parallel_rank"):
        return None
    return int(request.data_parallel_rank)


def _model_fields(model: Model) -> dict[str, Any]:
    """What the SGLang, vLLM, TokenSpeed and MLX `GetModelInfoResponse`s say alike."""
    return {
        "model_path": model.reported_path,
        "served_model_name": model.served_name,
        "max_context_length": model.max_context_length,
        "max_req_input_len": model.max_context_length,
        "vocab_size": model.vocab_size,
        "model_type": model.model_type,
        "architectures": model.architectures,
        "eos_token_ids": model.eos_token_ids,
        "pad_token_id": model.pad_token_id,
        "bos_token_id": model.bos_token_id,
    }


def _struct(values: dict[str, Any]) -> Struct:
    struct = Struct()
    struct.update(values)
    return struct


class SglangWire(Wire):
    pb = sglang_scheduler_pb2
    servicer_base = sglang_scheduler_pb2_grpc.SglangSchedulerServicer
    add_to_server = staticmethod(sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server)

    def asked(self, request: Any) -> Asked:
        params = request.sampling_params
        return Asked(
            request_id=request.request_id,
            input_ids=list(request.tokenized.input_ids),
            stream=request.stream,
            max_tokens=params.max_new_tokens if params.HasField("max_new_tokens") else None,
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
            keep_stop_token=params.no_stop_trim,
        )

    def model_info(self, model: Model) -> Any:
        return self.pb.GetModelInfoResponse(
            **_model_fields(model),
            tokenizer_path=model.reported_path,
            is_generation=True,
            default_sampling_params_json=model.default_sampling_json,
        )

    def server_info(self, model: Model, active: int, uptime: float) -> Any:
        return self.pb.GetServerInfoResponse(
            server_args=_struct(
                {
                    "model_path": model.reported_path,
                    "served_model_name": model.served_name,
                    "tokenizer_path": model.reported_path,
                    "context_length": model.max_context_length,
                    "tp_size": 1,
                    "dp_size": model.dp_size,
                }
            ),
            scheduler_info=_struct({"max_total_num_tokens": KV_CACHE_TOKENS}),
            active_requests=active,
            uptime_seconds=uptime,
            sglang_version="scripted",
            server_type="grpc",
            max_total_num_tokens=KV_CACHE_TOKENS,
        )


class VllmWire(Wire):
    pb = vllm_engine_pb2
    servicer_base = vllm_engine_pb2_grpc.VllmEngineServicer
    add_to_server = staticmethod(vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server)

    def asked(self, request: Any) -> Asked:
        params = request.sampling_params
        return Asked(
            request_id=request.request_id,
            input_ids=list(request.tokenized.input_ids),
            stream=request.stream,
            max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
        )

    def abort_ids(self, request: Any) -> list[str]:
        return [str(r) for r in request.request_ids]

    def abort_response(self, known: bool) -> Any:
        return self.pb.AbortResponse()

    def model_info(self, model: Model) -> Any:
        return self.pb.GetModelInfoResponse(
            **_model_fields(model),
            tokenizer_path=model.reported_path,
            is_generation=True,
            default_sampling_params_json=model.default_sampling_json,
        )

    def server_info(self, model: Model, active: int, uptime: float) -> Any:
        return self.pb.GetServerInfoResponse(
            active_requests=active,
            uptime_seconds=uptime,
            server_type="vllm-grpc",
            kv_connector=model.kv_connector,
            kv_role=model.kv_role,
            kv_engine_id=model.kv_engine_id,
            data_parallel_size=model.dp_size,
            kv_cache_dtype="auto",
            block_size=16,
            model_dtype="torch.bfloat16",
            max_num_seqs=128,
        )


class TrtllmWire(Wire):
    pb = trtllm_service_pb2
    servicer_base = trtllm_service_pb2_grpc.TrtllmServiceServicer
    add_to_server = staticmethod(trtllm_service_pb2_grpc.add_TrtllmServiceServicer_to_server)
    ids_field = "output_token_ids"

    def asked(self, request: Any) -> Asked:
        return Asked(
            request_id=request.request_id,
            input_ids=list(request.tokenized.input_token_ids),
            stream=request.streaming,
            max_tokens=request.max_tokens,
            stop=list(request.stop),
            stop_token_ids=list(request.stop_token_ids),
            ignore_eos=request.ignore_eos,
            keep_stop_token=request.include_stop_token_in_output,
        )

    def health(self, healthy: bool) -> Any:
        return self.pb.HealthCheckResponse(status="OK" if healthy else "unhealthy: set by a test")

    def model_info(self, model: Model) -> Any:
        return self.pb.GetModelInfoResponse(
            model_id=model.served_name,
            max_input_len=model.max_context_length,
            max_seq_len=model.max_context_length,
            max_batch_size=64,
            vocab_size=model.vocab_size,
            supported_features=["guided_decoding"],
        )

    def server_info(self, model: Model, active: int, uptime: float) -> Any:
        return self.pb.GetServerInfoResponse(
            version="scripted",
            backend="pytorch",
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            context_parallel_size=1,
            world_size=1,
        )


class TokenSpeedWire(Wire):
    pb = tokenspeed_scheduler_pb2
    servicer_base = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerServicer
    add_to_server = staticmethod(tokenspeed_scheduler_pb2_grpc.add_TokenSpeedSchedulerServicer_to_server)
    asked = SglangWire.asked  # its sampling params name the fields as SGLang's do

    def model_info(self, model: Model) -> Any:
        return self.pb.GetModelInfoResponse(
            **_model_fields(model),
            tokenizer_path=model.reported_path,
            default_sampling_params_json=model.default_sampling_json,
            model_dtype="bfloat16",
        )

    def server_info(self, model: Model, active: int, uptime: float) -> Any:
        return self.pb.GetServerInfoResponse(
            server_args=_struct(
                {
                    "model": model.reported_path,
                    "served_model_name": model.served_name,
                    "tokenizer": model.reported_path,
                    "context_length": model.max_context_length,
                    "dp_size": model.dp_size,
                }
            ),
            scheduler_info=_struct({}),
            active_requests=active,
            uptime_seconds=uptime,
            max_total_num_tokens=KV_CACHE_TOKENS,
            tokenspeed_version="scripted",
        )


class MlxWire(Wire):
    pb = mlx_engine_pb2
    servicer_base = mlx_engine_pb2_grpc.MlxEngineServicer
    add_to_server = staticmethod(mlx_engine_pb2_grpc.add_MlxEngineServicer_to_server)

    def asked(self, request: Any) -> Asked:
        params = request.sampling_params
        return Asked(
            request_id=request.request_id,
            input_ids=list(request.tokenized.input_ids),
            stream=request.stream,
            max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
            stop=[],
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
        )

    def complete(self, request_id: str, end: Ending) -> Any:
        complete = self.pb.GenerateComplete(
            output_ids=end.output_ids,
            finish_reason=end.finish_reason,
            prompt_tokens=end.prompt_tokens,
            completion_tokens=end.completion_tokens,
            cached_tokens=end.cached_tokens,
        )
        if end.matched_token_id is not None:
            complete.matched_stop_token_id = end.matched_token_id
        return self.response(request_id, complete=complete)

    def abort_ids(self, request: Any) -> list[str]:
        return [str(r) for r in request.request_ids]

    def abort_response(self, known: bool) -> Any:
        return self.pb.AbortResponse()

    def health(self, healthy: bool) -> Any:
        return self.pb.HealthCheckResponse(healthy=healthy, message="OK" if healthy else "set unhealthy by a test")

    def model_info(self, model: Model) -> Any:
        return self.pb.GetModelInfoResponse(**_model_fields(model), is_generation=True)

    def server_info(self, model: Model, active: int, uptime: float) -> Any:
        return self.pb.GetServerInfoResponse(server_type="mlx-grpc", active_requests=active, uptime_seconds=uptime)


WIRES: dict[str, type[Wire]] = {
    "sglang": SglangWire,
    "vllm": VllmWire,
    "trtllm": TrtllmWire,
    "tokenspeed": TokenSpeedWire,
    "mlx": MlxWire,
}


# --- the engine ----------------------------------------------------------------------------------


@dataclass
class _Stream:
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: int = 0  # prompt and output tokens so far: its share of the KV cache
    rank: int = 0  # the data-parallel rank serving it


@dataclass
class Engine:
    """The scripted engine's state: scripts, records, health, and the streams in flight."""

    runtime: str
    model: Model
    scripts: deque[Script] = field(default_factory=deque)
    default: Script | None = None
    received: list[dict[str, Any]] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    trace_context: list[dict[str, str]] = field(default_factory=list)  # each Generate's traceparent/tracestate
    healthy: bool = True
    released: asyncio.Event = field(default_factory=asyncio.Event)
    streams: dict[str, _Stream] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    role: str = "regular"
    address: tuple[str, int] = ("127.0.0.1", 0)  # where it serves: a vLLM prefill's handoff names it
    encoded: list[dict[str, Any]] = field(default_factory=list)
    encode_failures: deque[dict[str, Any]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.wire = WIRES[self.runtime]()
        self.semantics = SEMANTICS[self.runtime]

    # -- control ----------------------------------------------------------------------------

    def release(self) -> None:
        self.released.set()
        self.released = asyncio.Event()

    def reset(self) -> None:
        self.scripts.clear()
        self.default = None
        self.received.clear()
        self.encoded.clear()
        self.encode_failures.clear()
        self.aborts.clear()
        self.cancelled.clear()
        self.trace_context.clear()
        self.healthy = True
        self.release()

    async def control(self, method: str, body: bytes) -> dict[str, Any]:
        payload = json.loads(body or b"{}") if body else {}
        if not isinstance(payload, dict):
            raise ScriptError("the body must be a JSON object")
        if method == "Script":
            scripts = [Script.parse(s) for s in payload.get("scripts") or []]
            default = Script.parse(payload["default"]) if payload.get("default") is not None else None
            self.scripts.extend(scripts)
            if default is not None:
                self.default = default
            return {"queued": len(self.scripts)}
        if method == "Received":
            return {"requests": list(self.received)}
        if method == "Encoded":
            return {"requests": list(self.encoded)}
        if method == "EncodeFailure":
            self.encode_failures.append(payload)
            return {"queued": len(self.encode_failures)}
        if method == "Aborts":
            return {"request_ids": list(self.aborts)}
        if method == "Cancelled":
            return {"request_ids": list(self.cancelled)}
        if method == "TraceContext":
            return {"metadata": list(self.trace_context)}
        if method == "Reset":
            self.reset()
            return {"reset": True}
        if method == "Release":
            self.release()
            return {"released": True}
        if method == "SetHealth":
            healthy = payload.get("healthy")
            if not isinstance(healthy, bool):
                raise ScriptError("healthy must be a boolean")
            self.healthy = healthy
            return {"healthy": healthy}
        raise ScriptError(f"unknown control method {method}")

    # -- the engine service -----------------------------------------------------------------

    async def generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self.received.append(MessageToDict(request, preserving_proto_field_name=True))
        if self.role == "encode":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "an encode worker does not generate")
        metadata = context.invocation_metadata() or ()
        self.trace_context.append({k: str(v) for k, v in metadata if k in ("traceparent", "tracestate")})
        asked = self.wire.asked(request)
        rank = pinned_rank(request)
        refusal = self._refusal(asked) or self._disaggregation_refusal(request) or self._rank_refusal(rank)
        if refusal is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
        if self.role == "prefill" and self.runtime in _RENDEZVOUS_FIELD:
            # A prefill leg computes the prompt's KV and the first token, then hands off.
            asked = replace(asked, max_tokens=1)
        handoff = self._handoff(request)
        script = self._take_script(asked)
        plan = make_plan(script, asked, self.model, self.semantics)
        stream = _Stream(tokens=len(asked.input_ids), rank=rank or 0)
        self.streams[asked.request_id] = stream
        # A client's cancel reaches the handler as CancelledError only when it lands while the
        # generator runs; one that lands while grpc is sending a message ends the generator
        # with GeneratorExit instead. The call's own record of it sees both.
        rid = asked.request_id

        def done(ctx: Any) -> None:
            if ctx.cancelled() and rid not in self.cancelled:
                self.cancelled.append(rid)

        context.add_done_callback(done)
        try:
            async for response in self._run(asked, script, plan, stream, context):
                if handoff is not None and response.WhichOneof("response") == "complete":
                    response.complete.kv_transfer_params_json = handoff
                yield response
        except (asyncio.CancelledError, GeneratorExit):
            # GeneratorExit: grpcio closed the handler, the client gone mid-send.
            if rid not in self.cancelled:
                self.cancelled.append(rid)
            raise
        finally:
            if self.streams.get(asked.request_id) is stream:
                del self.streams[asked.request_id]

    def _rank_refusal(self, rank: int | None) -> str | None:
        if rank is not None and not 0 <= rank < self.model.dp_size:
            return f"data_parallel_rank {rank} is out of range: the engine has {self.model.dp_size} ranks"
        return None

    def _take_script(self, asked: Asked) -> Script:
        """The first queued script matching the prompt (dequeued unless it repeats), else the default."""
        decoded: list[str] = []

        def prompt() -> str:
            if not decoded:
                decoded.append(self.model.decode_prompt(asked.input_ids))
            return decoded[0]

        for index, script in enumerate(self.scripts):
            if script.matches(prompt):
                if not script.repeat:
                    del self.scripts[index]
                return script
        return self.default or Script()

    def _disaggregation_refusal(self, request: Any) -> str | None:
        """A PD leg of SGLang or TokenSpeed needs its rendezvous, as the real schedulers do."""
        name = _RENDEZVOUS_FIELD.get(self.runtime)
        if self.role not in ("prefill", "decode") or name is None:
            return None
        if not request.HasField(name) or not getattr(request, name).bootstrap_room:
            return NO_ROOM
        if self.runtime == "tokenspeed" and self.role == "prefill" and request.HasField("mm_inputs"):
            pixelless = {i for i, item in enumerate(request.mm_inputs.items) if not item.HasField("encoder_input")}
            named = {b.item_index for b in request.encode_bootstrap_info.items if b.bootstrap_room}
            if not pixelless <= named:
                return f"multimodal items {sorted(pixelless - named)} have neither pixels nor an encode bootstrap"
        return None

    def _handoff(self, request: Any) -> str | None:
        """What a vLLM prefill leg tagged `do_remote_decode` returns for its decode leg."""
        if self.runtime != "vllm" or self.role != "prefill" or not request.HasField("kv_transfer_params_json"):
            return None
        try:
            tagged = json.loads(request.kv_transfer_params_json)
        except ValueError:
            return None
        if not isinstance(tagged, dict) or not tagged.get("do_remote_decode"):
            return None
        host, port = self.address
        blocks = list(range((len(request.tokenized.input_ids) + 15) // 16))
        return json.dumps(
            {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.model.kv_engine_id,
                "remote_block_ids": blocks,
                "remote_host": host,
                "remote_port": port,
                "remote_request_id": request.request_id,
                "tp_size": 1,
            }
        )

    async def encode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.encoded.append(MessageToDict(request, preserving_proto_field_name=True))
        if self.encode_failures:
            failure = self.encode_failures.popleft()
            if failure.get("accepted") is False:
                return tokenspeed_encoder_pb2.EncodeResponse(accepted=False)
            code = getattr(grpc.StatusCode, str(failure.get("code") or "INTERNAL"))
            await context.abort(code, str(failure.get("message") or "scripted encode failure"))
        return tokenspeed_encoder_pb2.EncodeResponse(accepted=True)

    def _refusal(self, asked: Asked) -> str | None:
        if not asked.input_ids:
            return "The decoder prompt cannot be empty"
        if len(asked.input_ids) > self.model.max_context_length:
            return (
                f"The decoder prompt (length {len(asked.input_ids)}) is longer than the maximum model length "
                f"of {self.model.max_context_length}. Make sure that `max_model_len` is no smaller than the "
                "number of text tokens."
            )
        return None

    async def _run(
        self, asked: Asked, script: Script, plan: Plan, stream: _Stream, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        semantics, wire, rid = self.semantics, self.wire, asked.request_id
        generated = plan.generated
        groups = [generated[i : i + script.chunk_size] for i in range(0, len(generated), script.chunk_size)]
        last_visible: list[int] = []
        sent = 0  # tokens generated so far
        visible_sent: list[int] = []
        chunks_sent = 0
        held = False
        for index, group in enumerate(groups):
            if script.hold_after is not None and not held and sent >= script.hold_after:
                held = True
                await self._pause(stream, self.released, None, context)
            if script.exit_after is not None and sent >= script.exit_after:
                exit_now(f"the script exits after {sent} tokens")
            if script.error is not None and sent >= script.error.after_tokens:
                await context.abort(grpc.StatusCode[script.error.code], script.error.message)
            if index and script.delay:
                await self._pause(stream, None, script.delay, context)
            if stream.aborted.is_set():
                async for response in self._aborted(asked, plan, sent, visible_sent, chunks_sent):
                    yield response
                return
            final = index == len(groups) - 1
            visible = group[:-1] if final and plan.trim_last else list(group)
            sent += len(group)
            stream.tokens += len(group)
            visible_sent.extend(visible)
            last_visible = visible
            if not asked.stream or (semantics.skips_empty_chunks and not visible and chunks_sent):
                continue
            if semantics.chunk_counts == "delta":
                count = len(visible)
            elif semantics.trims_stop_token and not semantics.counts_trimmed:
                count = len(visible_sent)
            else:
                count = sent
            chunks_sent += 1
            yield wire.chunk(rid, visible, plan.prompt_tokens, count, plan.cached_tokens)
        if script.hold_after is not None and not held and sent >= script.hold_after:
            await self._pause(stream, self.released, None, context)
        if script.exit_after is not None:
            exit_now(f"the script exits after {sent} tokens")
        if script.error is not None:
            await context.abort(grpc.StatusCode[script.error.code], script.error.message)
        if stream.aborted.is_set():
            async for response in self._aborted(asked, plan, sent, visible_sent, chunks_sent):
                yield response
            return
        total = sent if semantics.counts_trimmed or not plan.trim_last else len(visible_sent)
        if not asked.stream:
            ids, count = visible_sent, total
        elif semantics.stream_complete_ids == "last":
            ids = last_visible
            count = len(last_visible) if semantics.chunk_counts == "delta" else total
        elif semantics.stream_complete_ids == "all":
            ids, count = visible_sent, total
        else:
            ids, count = [], total
        yield wire.complete(
            rid,
            Ending(
                output_ids=ids,
                finish_reason=plan.finish_reason,
                prompt_tokens=plan.prompt_tokens,
                completion_tokens=count,
                cached_tokens=plan.cached_tokens,
                matched_token_id=plan.matched_token_id,
                matched_stop_str=plan.matched_stop_str,
            ),
        )

    async def _aborted(
        self, asked: Asked, plan: Plan, sent: int, visible_sent: list[int], chunks_sent: int
    ) -> AsyncIterator[Any]:
        semantics, rid = self.semantics, asked.request_id
        if asked.stream and semantics.empty_chunk_on_abort:
            yield self.wire.chunk(rid, [], plan.prompt_tokens, 0, plan.cached_tokens)
        if not asked.stream or semantics.stream_complete_ids == "all":
            ids = list(visible_sent)
        else:
            ids = []
        count = 0 if asked.stream and semantics.chunk_counts == "delta" else sent
        yield self.wire.complete(
            rid,
            Ending(
                output_ids=ids,
                finish_reason="abort",
                prompt_tokens=plan.prompt_tokens,
                completion_tokens=count,
                cached_tokens=plan.cached_tokens,
            ),
        )

    @staticmethod
    async def _pause(
        stream: _Stream, until: asyncio.Event | None, seconds: float | None, context: Any = None
    ) -> None:
        """Wait for `until` (or `seconds`), cut short by an abort of the stream; a client's
        cancel ends it with CancelledError (grpcio does not always interrupt a handler that
        waits on something of its own)."""
        waiters = [asyncio.ensure_future(stream.aborted.wait())]
        if until is not None:
            waiters.append(asyncio.ensure_future(until.wait()))
        cancelled = None
        if context is not None:

            async def watch() -> None:
                while not context.cancelled():
                    await asyncio.sleep(0.02)

            cancelled = asyncio.ensure_future(watch())
            waiters.append(cancelled)
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if cancelled is not None and cancelled.done() and not cancelled.cancelled():
            raise asyncio.CancelledError

    async def health(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self.wire.health(self.healthy)

    async def abort(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        known = False
        for request_id in self.wire.abort_ids(request):
            self.aborts.append(request_id)
            stream = self.streams.get(request_id)
            if stream is not None:
                stream.aborted.set()
                known = True
        return self.wire.abort_response(known)

    async def model_info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self.wire.model_info(self.model)

    async def server_info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self.wire.server_info(self.model, len(self.streams), time.time() - self.started)

    async def loads(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ranks = {rank: (0, 0) for rank in range(self.model.dp_size)}
        for stream in self.streams.values():
            running, tokens = ranks[stream.rank]
            ranks[stream.rank] = (running + 1, tokens + stream.tokens)
        if request.HasField("dp_rank"):
            ranks = {r: load for r, load in ranks.items() if r == request.dp_rank}
        return self.wire.loads(ranks)

    async def tokenizer(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if self.model.hold_tokenizer:
            await self.released.wait()
        if not self.model.bundle_enabled:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Tokenizer path is not configured on this server.")
        data, digest = self.model.bundle()
        for offset in range(0, len(data), BUNDLE_CHUNK_BYTES):
            end = min(offset + BUNDLE_CHUNK_BYTES, len(data))
            yield common_pb2.GetTokenizerChunk(data=data[offset:end], sha256=digest if end == len(data) else "")


def servicer(engine: Engine) -> Any:
    """The runtime's generated servicer, its scripted methods bound to `engine` (the others
    answer `UNIMPLEMENTED`, as the generated base does)."""

    # grpc.aio tells coroutine and async-generator handlers from plain ones by their function
    # kind, so each method is a real `async def`, not a lambda returning a coroutine.
    async def generate(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for response in engine.generate(request, context):
            yield response

    async def tokenizer(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for chunk in engine.tokenizer(request, context):
            yield chunk

    async def health(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await engine.health(request, context)

    async def abort(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await engine.abort(request, context)

    async def model_info(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await engine.model_info(request, context)

    async def server_info(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await engine.server_info(request, context)

    async def loads(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await engine.loads(request, context)

    methods: dict[str, Callable[..., Any]] = {
        "Generate": generate,
        "GetTokenizer": tokenizer,
        "HealthCheck": health,
        "Abort": abort,
        "GetModelInfo": model_info,
        "GetServerInfo": server_info,
    }
    if engine.wire.has_loads:
        methods["GetLoads"] = loads
    cls = type(f"Scripted{engine.wire.servicer_base.__name__}", (engine.wire.servicer_base,), methods)
    return cls()


CONTROL_METHODS = (
    "Script", "Received", "Encoded", "EncodeFailure", "Aborts", "Cancelled", "TraceContext", "Reset", "Release",
    "SetHealth",
)


def encoder_servicer(engine: Engine) -> Any:
    """TokenSpeed's encoder service, bound to `engine` (an encode worker's)."""

    async def encode(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await engine.encode(request, context)

    base = tokenspeed_encoder_pb2_grpc.TokenSpeedEncoderServicer
    return type("ScriptedTokenSpeedEncoder", (base,), {"Encode": encode})()


def control_handler(engine: Engine) -> grpc.GenericRpcHandler:
    """The `tools.ScriptedEngine` service: JSON bytes in, JSON bytes out."""

    def method(name: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def handle(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                answer = await engine.control(name, body)
            except (ScriptError, ValueError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return json.dumps(answer).encode()

        return handle

    handlers = {name: grpc.unary_unary_rpc_method_handler(method(name)) for name in CONTROL_METHODS}
    return grpc.method_handlers_generic_handler(CONTROL_SERVICE, handlers)


async def serve(args: argparse.Namespace) -> None:
    model = Model.load(args)
    if args.role == "encode" and args.runtime != "tokenspeed":
        print("--role encode is a TokenSpeed encode worker: use --runtime tokenspeed", file=sys.stderr, flush=True)
        raise SystemExit(2)
    engine = Engine(args.runtime, model, role=args.role, address=(args.host, args.port))
    server = grpc.aio.server(options=SERVER_OPTIONS)
    engine.wire.add_to_server(servicer(engine), server)
    if args.role == "encode":
        tokenspeed_encoder_pb2_grpc.add_TokenSpeedEncoderServicer_to_server(encoder_servicer(engine), server)
    server.add_generic_rpc_handlers((control_handler(engine),))
    address = f"{args.host}:{args.port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        print(f"cannot bind {address}: address already in use ({exc})", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    print(
        f"{READY_LINE}: runtime={args.runtime} role={args.role} model={model.served_name} grpc://{address}",
        flush=True,
    )
    await stopping.wait()
    await server.stop(grace=0.5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.scripted_engine", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--runtime", choices=RUNTIMES, default="sglang")
    parser.add_argument("--model-path", required=True, help="a transformers-loadable tokenizer directory")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument(
        "--reported-model-path",
        default=None,
        help="the model/tokenizer path model info tells (default --model-path), e.g. one the gateway cannot read",
    )
    parser.add_argument("--max-context-length", type=int, default=None)
    parser.add_argument("--no-tokenizer-bundle", action="store_true", help="GetTokenizer answers FAILED_PRECONDITION")
    parser.add_argument("--hold-tokenizer", action="store_true", help="GetTokenizer waits for a Release")
    parser.add_argument("--eos-token-ids", default="", help="comma-separated; default generation_config.json's")
    parser.add_argument("--default-sampling-params", default="", help="JSON merged into default_sampling_params_json")
    parser.add_argument("--role", choices=ROLES, default="regular", help="a leg of a disaggregated deployment")
    parser.add_argument(
        "--dp-size", type=int, default=1, help="data-parallel ranks GetServerInfo and GetLoads report (default 1)"
    )
    parser.add_argument(
        "--kv-connector", default=None, help="vLLM GetServerInfo's kv_connector (default NixlConnector for PD roles)"
    )
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
