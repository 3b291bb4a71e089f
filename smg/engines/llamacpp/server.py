"""The SGLang scheduler service (`sglang.grpc.scheduler.SglangScheduler`) over llama.cpp.

llama.cpp runs in-process (`xllamacpp`): its server loop schedules requests over `--parallel`
slots sharing one KV cache, and `handle_completions` blocks its caller while it calls back once
per token. Each `Generate` therefore runs that call on a worker thread, its callback a
`generation.Run` that hands the token ids to the RPC's event loop; `Abort` and a caller that
went away set the run's flags, and its next callback ends the generation.

The answers follow SGLang's servicer: chunks carry the new token ids with running totals; a
streamed `complete` repeats the last chunk's ids, a non-streamed one carries them all; EOS and
stop tokens stay in the ids and are named in `matched_token_id` (a stop string in
`matched_stop_str`); an aborted generation ends with finish reason "abort".
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tempfile
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf.struct_pb2 import Struct
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from smg.engines.llamacpp.generation import END, Run
from smg.engines.llamacpp.gguf import ModelFacts, read_metadata
from smg.engines.llamacpp.sampling import Refusal, plan

READY_LINE = "llamacpp engine ready"
BUNDLE_CHUNK_BYTES = 64 * 1024
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


@dataclass(frozen=True)
class EngineConfig:
    """How `smg engine llamacpp` runs a model."""

    gguf: Path
    host: str = "127.0.0.1"
    port: int = 30001
    served_model_name: str | None = None
    ctx_size: int | None = None  # default: the model's context length, at most 8192
    parallel: int = 4
    threads: int | None = None  # default: half the cores, at least one
    tokenizer_dir: Path | None = None
    # Sampling values a request that names none gets (the gateway reads them from GetModelInfo);
    # over the GGUF's own `general.sampling.*`.
    default_sampling: dict[str, float] = field(default_factory=dict)


def default_threads() -> int:
    # llama.cpp's decode threads spin; on a machine the gateway shares, all cores collapse throughput.
    return max(1, (os.cpu_count() or 2) // 2)


class LlamaCppEngine:
    """A GGUF model loaded into llama.cpp, and the generations in flight."""

    def __init__(self, config: EngineConfig) -> None:
        import xllamacpp

        self.config = config
        self.gguf = config.gguf.resolve()
        self.facts = ModelFacts.of(read_metadata(self.gguf))
        self.ctx_size = config.ctx_size or min(self.facts.context_length or 4096, 8192)
        self.served_name = config.served_model_name or self.gguf.stem
        self.threads = config.threads or default_threads()
        params = xllamacpp.CommonParams()
        params.model.path = str(self.gguf)
        params.n_ctx = self.ctx_size
        params.n_parallel = config.parallel
        # One cache for every slot: any request may use the whole context.
        params.kv_unified = True
        params.warmup = False
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        self._server = xllamacpp.Server(params)
        self.llamacpp_url = str(self._server.listening_address)
        self.version = str(getattr(xllamacpp, "__version__", ""))
        self.started = time.time()
        self.runs: dict[str, Run] = {}  # by request id, while its RPC is open
        # Generations still running in llama.cpp (a cancelled RPC's goes on to its next token),
        # and every token generated since start: what GetServerInfo reports.
        self._counts_lock = threading.Lock()
        self.generating = 0
        self.generated_tokens = 0
        self._executor = ThreadPoolExecutor(max_workers=max(16, 4 * config.parallel), thread_name_prefix="llamacpp")
        self._bundle: tuple[bytes, str] | None = None
        self._bundle_lock = asyncio.Lock()

    # -- generation --------------------------------------------------------------------------

    async def generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            asked = plan(request, vocab_size=self.facts.vocab_size, context_length=self.ctx_size)
        except Refusal as refusal:
            await context.abort(refusal.code, refusal.message)
        rid = request.request_id
        prompt = len(request.tokenized.input_ids)
        if asked.max_new_tokens == 0:
            yield self._complete(rid, [], "length", prompt, 0, 0)
            return
        run = Run(asked, frozenset(self.facts.eos_token_ids), asyncio.get_running_loop())
        self.runs[rid] = run
        with self._counts_lock:
            self.generating += 1
        self._executor.submit(run.execute, self._server.handle_completions).add_done_callback(
            lambda _: self._finished(run)
        )
        last: list[int] = []
        try:
            while True:
                item = await run.queue.get()
                if item is END:
                    break
                last = item
                if request.stream:
                    yield pb.GenerateResponse(
                        request_id=rid,
                        chunk=pb.GenerateStreamChunk(
                            token_ids=item,
                            prompt_tokens=prompt,
                            completion_tokens=len(run.ids),
                            cached_tokens=run.cached_tokens,
                        ),
                    )
            if run.error is not None and not run.aborted.is_set():
                await context.abort(run.error[0], run.error[1])
            finish = "abort" if run.aborted.is_set() else run.finish_reason or "stop"
            ids = last if request.stream else list(run.ids)
            if finish == "abort" and request.stream:
                ids = []
            yield self._complete(
                rid, ids, finish, prompt, len(run.ids), run.cached_tokens, run.matched_token_id, run.matched_stop_str
            )
        finally:
            # A client that went away (or any early exit) ends the generation at its next token.
            run.gone.set()
            if self.runs.get(rid) is run:
                del self.runs[rid]

    def _finished(self, run: Run) -> None:
        with self._counts_lock:
            self.generating -= 1
            self.generated_tokens += len(run.ids)

    @staticmethod
    def _complete(
        rid: str,
        ids: list[int],
        finish: str,
        prompt: int,
        completion: int,
        cached: int,
        matched_token_id: int | None = None,
        matched_stop_str: str | None = None,
    ) -> Any:
        complete = pb.GenerateComplete(
            output_ids=ids,
            finish_reason=finish,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
        )
        if finish != "abort":
            if matched_token_id is not None:
                complete.matched_token_id = matched_token_id
            elif matched_stop_str is not None:
                complete.matched_stop_str = matched_stop_str
        return pb.GenerateResponse(request_id=rid, complete=complete)

    def abort(self, request_id: str) -> bool:
        run = self.runs.get(request_id)
        if run is None:
            return False
        run.aborted.set()
        return True

    # -- what the engine says about itself ------------------------------------------------------

    def model_info(self) -> Any:
        facts = self.facts
        defaults = {**facts.sampling_defaults, **self.config.default_sampling}
        return pb.GetModelInfoResponse(
            model_path=str(self.gguf),
            tokenizer_path=str(self.config.tokenizer_dir.resolve()) if self.config.tokenizer_dir else "",
            is_generation=True,
            served_model_name=self.served_name,
            max_context_length=self.ctx_size,
            vocab_size=facts.vocab_size,
            model_type=facts.architecture,
            architectures=facts.architectures,
            eos_token_ids=facts.eos_token_ids,
            pad_token_id=facts.pad_token_id or 0,
            bos_token_id=facts.bos_token_id or 0,
            max_req_input_len=self.ctx_size - 1,
            default_sampling_params_json=_json(defaults) if defaults else "",
        )

    def server_info(self) -> Any:
        args = Struct()
        args.update(
            {
                "model_path": str(self.gguf),
                "served_model_name": self.served_name,
                "tokenizer_path": str(self.config.tokenizer_dir or ""),
                "context_length": self.ctx_size,
                "parallel": self.config.parallel,
                "threads": self.threads,
                "llamacpp_url": self.llamacpp_url,
                "tp_size": 1,
                "dp_size": 1,
            }
        )
        with self._counts_lock:
            generating, generated = self.generating, self.generated_tokens
        scheduler = Struct()
        scheduler.update(
            {"generating": generating, "generated_tokens": generated, "max_total_num_tokens": self.ctx_size}
        )
        return pb.GetServerInfoResponse(
            server_args=args,
            scheduler_info=scheduler,
            active_requests=generating,
            uptime_seconds=time.time() - self.started,
            sglang_version=f"llama.cpp (xllamacpp {self.version})",
            server_type="grpc",
            max_total_num_tokens=self.ctx_size,
        )

    def loads(self) -> Any:
        running = min(len(self.runs), self.config.parallel)
        waiting = len(self.runs) - running
        load = pb.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            num_total_reqs=len(self.runs),
            max_total_num_tokens=self.ctx_size,
            max_running_requests=self.config.parallel,
            utilization=running / self.config.parallel,
        )
        return pb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            version=self.version,
            dp_rank_count=1,
            loads=[load],
            aggregate=pb.AggregateMetrics(
                total_running_reqs=running, total_waiting_reqs=waiting, total_reqs=len(self.runs)
            ),
        )

    async def bundle(self) -> tuple[bytes, str]:
        """The tokenizer directory as a zip (flat, as SGLang's servicer sends it) and its sha256:
        `--tokenizer-dir`, else exported from the GGUF once."""
        async with self._bundle_lock:
            if self._bundle is None:
                self._bundle = await asyncio.get_running_loop().run_in_executor(self._executor, self._build_bundle)
            return self._bundle

    def _build_bundle(self) -> tuple[bytes, str]:
        with tempfile.TemporaryDirectory(prefix="smg-tokenizer-") as scratch:
            directory = self.config.tokenizer_dir
            if directory is None:
                from smg.engines.llamacpp.tokenizer import export_tokenizer

                directory = export_tokenizer(self.gguf, Path(scratch))
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for file in sorted(Path(directory).iterdir()):
                    if file.is_file():
                        archive.write(file, file.name)
        data = buffer.getvalue()
        return data, hashlib.sha256(data).hexdigest()

    def close(self) -> None:
        for run in list(self.runs.values()):
            run.gone.set()
        self._executor.shutdown(wait=True)
        del self._server


def _json(value: dict[str, Any]) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


class _Servicer(pb_grpc.SglangSchedulerServicer):  # type: ignore[misc]
    """The service's methods, bound to one engine (the rest answer UNIMPLEMENTED)."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # noqa: N802
        async for response in self.engine.generate(request, context):
            yield response

    async def HealthCheck(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return pb.HealthCheckResponse(healthy=True, message="OK")

    async def Abort(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        known = self.engine.abort(request.request_id)
        return pb.AbortResponse(success=known, message="aborted" if known else "not found")

    async def GetModelInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return self.engine.model_info()

    async def GetServerInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return self.engine.server_info()

    async def GetLoads(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return self.engine.loads()

    async def GetTokenizer(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # noqa: N802
        try:
            data, digest = await self.engine.bundle()
        except Exception as exc:  # an export failure is the caller's answer, not a crash
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot build the tokenizer bundle: {exc}")
        for offset in range(0, len(data), BUNDLE_CHUNK_BYTES):
            end = min(offset + BUNDLE_CHUNK_BYTES, len(data))
            yield common_pb2.GetTokenizerChunk(data=data[offset:end], sha256=digest if end == len(data) else "")


async def serve(config: EngineConfig, *, ready: Callable[[str], None] = print) -> None:
    """Load the model, serve until SIGINT/SIGTERM, then stop generations and unload."""
    import signal

    engine = LlamaCppEngine(config)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_SglangSchedulerServicer_to_server(_Servicer(engine), server)
    address = f"{config.host}:{config.port}"
    try:
        try:
            server.add_insecure_port(address)
        except RuntimeError as exc:
            raise SystemExit(f"cannot bind {address}: address already in use ({exc})") from None
        await server.start()
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        ready(f"{READY_LINE}: model={engine.served_name} grpc://{address} (llama.cpp {engine.llamacpp_url})")
        await stopping.wait()
        await server.stop(grace=1.0)
    finally:
        engine.close()
