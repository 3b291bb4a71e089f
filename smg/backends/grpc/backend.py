"""The engine connector: the gateway implements the Messages API itself, over gRPC or ZMQ.

For each request (the router has checked that the model is served): its tokenizer ready (the
registry's three refusals), the conversation rendered and tokenized; count_tokens and
`max_tokens: 0` are answered here without a worker. Otherwise each attempt's worker (the
router's choice) has the prompt checked against its context window, and the engine's token
stream is run through the sans-IO `Generation`, yielding `rendered`, `tokens` and `block`
events. A client that goes away mid-generation has its engine request aborted. An engine's
runtime is `--backend`'s, else detected from which protocol it answers. A deployment that
serves images (EPD) has a generation's images fetched and preprocessed here, before any worker
is chosen, and its prompt's placeholders expanded (`smg.pipeline.media`, `smg.pipeline.vision`).

One class serves every engine wire: it is built with a client factory (`grpc_clients`, or the
ZMQ one in `smg.backends.zmq.connector`) and a name, the journal's backend name.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from journal.events import Block, Counted, Error, Event, Rendered, Routed
from smg.backends.base import Attempts, Call, Discovery, Failure, Target, WorkerUnreachable
from smg.backends.grpc.discovery import EngineWorker, check_health, describe, register_tokenizer
from smg.backends.grpc.engines import connect
from smg.backends.grpc.engines.base import strip_scheme
from smg.backends.grpc.engines.detect import detect_runtime
from smg.backends.grpc.request import (
    check_servable,
    engine_failure,
    generate_call,
    sampling_defaults,
    stop_token_map,
)
from smg.backends.grpc.types import EngineChunk, EngineClient, EngineDone, EngineError, EngineEvent, GenerateCall
from smg.config import GatewayConfig
from smg.fetch import Fetcher
from smg.pipeline.attempt import Attempt
from smg.pipeline.generation import Generation, GenerationSettings, empty_message
from smg.pipeline.media import load_images, user_images
from smg.pipeline.output import OutputPlan, apply_plan, build_stages, plan_output
from smg.pipeline.render import Prompt, render_prompt
from smg.pipeline.render.bound import context_exceeded, prompt_token_floor
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.pipeline.tokenizers.tokenizer import Tokenizer, warm_import
from smg.pipeline.vision import QwenVlProcessor, VisionItem, expand
from smg.protocol.errors import ApiError
from smg.protocol.ids import random_id

log = logging.getLogger("smg.grpc")

# Bodies up to this size render inline; the thread hop costs more than rendering them.
_RENDER_INLINE_BYTES = 16_384


def new_message_id() -> str:
    return random_id("msg_")


def error_event(err: ApiError, stage: str = "engine") -> Error:
    """A failure after the request reached an engine, as the journal and the client get it."""
    return Error(
        stage=stage,
        status=err.status,
        error_type=err.type,
        message=err.message,
        code=err.code,
        headers=err.response_headers(),
        detail=err.detail,
    )


@dataclass
class Prepared:
    """What every attempt of one generation shares: the request, its rendered prompt and the
    output plan; `generation` is built at the first attempt and kept across retries."""

    call: Call
    tokenizer: Tokenizer
    prompt: Prompt
    message_id: str
    source: str | None
    settings: GenerationSettings
    plan: OutputPlan
    stop_ids: dict[int, str]
    generation: Generation | None = None
    images: list[VisionItem] = field(default_factory=list)  # placeholders expanded in `prompt.ids`


GenerateStrategy = Callable[[Prepared, Attempts], AsyncGenerator[Event, None]]


def settings_record(settings: GenerationSettings) -> dict[str, Any]:
    """The settings as the journal keeps them (JSON object keys are strings)."""
    record = asdict(settings)
    record["stop_token_map"] = {str(k): v for k, v in settings.stop_token_map.items()}
    return record


# A worker's engine runtime and its protocol client; raises `WorkerUnreachable`.
ClientFactory = Callable[[Target], Awaitable[tuple[str, EngineClient]]]


async def grpc_clients(target: Target) -> tuple[str, EngineClient]:
    """A gRPC engine's client, its runtime `--backend`'s or detected from what it answers."""
    address = strip_scheme(target.url)
    runtime = target.runtime
    if runtime is None:
        try:
            runtime = await detect_runtime(address)
        except EngineError as exc:
            raise WorkerUnreachable(f"runtime detection failed: {exc.message or exc.code}") from None
        log.info("worker %s speaks the %s engine protocol", target.url, runtime)
    return runtime, connect(runtime, address)


class EngineConnector:
    """Serves Messages and count_tokens from inference engines (gRPC, ZMQ)."""

    generates = True

    def __init__(
        self,
        config: GatewayConfig,
        tokenizers: TokenizerRegistry | None = None,
        *,
        name: str = "grpc",
        clients: ClientFactory = grpc_clients,
        live_loads: bool = False,
    ) -> None:
        self.name = name
        # The client's `loads` is local knowledge of whether its engine is alive (ZMQ): an
        # UNAVAILABLE there takes the worker out at once.
        self._live_loads = live_loads
        self._clients = clients
        self._config = config
        self.tokenizers = tokenizers or TokenizerRegistry(autoload=config.tokenizer_autoload)
        self._engines: dict[str, EngineWorker] = {}
        self._aborts: set[asyncio.Task[None]] = set()
        self._autoloads: dict[str, asyncio.Task[None]] = {}  # engine URL → its tokenizer's autoload
        self._configured_tokenizer = config.tokenizer_path or config.model_path
        self._chat_template = str(config.chat_template) if config.chat_template else None
        self._media = Fetcher(config.fetch.policy())  # fetches image URLs (EPD)
        self._vision: QwenVlProcessor | None = None

    # lifecycle

    async def start(self) -> None:
        if self.tokenizers.autoload and not self._configured_tokenizer:
            # Every tokenizer this gateway will hold comes from a worker, later: importing
            # transformers (seconds) now keeps it off a new worker's way to serving.
            threading.Thread(target=warm_import, name="smg-tokenizer-import", daemon=True).start()

    async def close(self) -> None:
        await self._media.aclose()
        await asyncio.gather(*self._aborts, return_exceptions=True)
        for task in self._autoloads.values():
            task.cancel()
        await asyncio.gather(*self._autoloads.values(), return_exceptions=True)
        await self.tokenizers.close()
        await asyncio.gather(*(e.client.close() for e in self._engines.values()), return_exceptions=True)

    async def _engine(self, target: Target) -> EngineWorker:
        engine = self._engines.get(target.id)
        if engine is None and target.dp_rank is not None:
            # The ranks of one engine (`url@rank`) share its client and what it said of itself.
            engine = next((e for e in self._engines.values() if e.url == target.url), None)
            if engine is not None:
                self._engines[target.id] = engine
        if engine is None:
            runtime, client = await self._clients(target)
            engine = self._engines.get(target.id)  # another task may have made it meanwhile
            if engine is not None:
                await client.close()
                return engine
            engine = self._engines[target.id] = EngineWorker(url=target.url, client=client, runtime=runtime)
        return engine

    async def discover(self, target: Target) -> Discovery:
        engine = await self._engine(target)
        found = await describe(engine, dp_aware=self._config.router.dp_aware)
        assert engine.info is not None
        engine.sampling_defaults = sampling_defaults(engine.info.default_sampling)
        await self._register_tokenizer(engine)
        return found

    async def _register_tokenizer(self, engine: EngineWorker) -> None:
        """A configured tokenizer is loaded before the worker serves; an autoloaded one (fetched
        from the worker, seconds for a real model) loads while the gateway already serves, and
        requests for its model are answered 503 `tokenizer_not_ready` meanwhile."""
        if self._configured_tokenizer:
            await self._load_tokenizer(engine)
            return
        if engine.url in self._autoloads:
            return
        task = asyncio.get_running_loop().create_task(self._load_tokenizer(engine), name=f"smg-autoload-{engine.url}")
        self._autoloads[engine.url] = task
        task.add_done_callback(lambda _: self._autoloads.pop(engine.url, None))

    async def _load_tokenizer(self, engine: EngineWorker) -> None:
        await register_tokenizer(
            engine, self.tokenizers, configured_path=self._configured_tokenizer, chat_template=self._chat_template
        )

    async def _tokenizer(self, model: str, pool: Sequence[Target]) -> Tokenizer:
        """The model's tokenizer; one still being fetched or loaded is waited for (up to
        `--tokenizer-wait-secs`, within the request's deadline) before the registry's refusal."""
        try:
            return self.tokenizers.get(model)
        except ApiError as refused:
            wait = self._config.engine.tokenizer_wait_secs
            if refused.code != "tokenizer_not_ready" or wait <= 0:
                raise
        pending: set[asyncio.Future[Any]] = {self._autoloads[t.url] for t in pool if t.url in self._autoloads}
        entry = self.tokenizers.lookup(model)
        loaded = asyncio.ensure_future(entry.done.wait()) if entry is not None and not entry.done.is_set() else None
        if loaded is not None:
            pending.add(loaded)
        try:
            if pending:
                # The loads go on for the next request if this one gives up (not cancelled).
                await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if loaded is not None:
                loaded.cancel()
        return self.tokenizers.get(model)

    async def check_health(self, target: Target, timeout: float, endpoint: str) -> bool:
        engine = await self._engine(target)
        ok = await check_health(engine, timeout)
        if ok and engine.info is not None:
            # A model whose tokenizer failed to load is given another chance at each check.
            await self._register_tokenizer(engine)
        return ok

    async def forget(self, target: Target) -> None:
        engine = self._engines.pop(target.id, None)
        if engine is not None and all(e is not engine for e in self._engines.values()):
            await engine.client.close()

    async def load(self, target: Target) -> int | None:
        engine = self._engines.get(target.id)
        if engine is None:
            return None
        try:
            loads = await engine.client.loads()
        except EngineError as exc:
            if self._live_loads and exc.unavailable:
                raise WorkerUnreachable(exc.message) from None
            return None
        engine.loads = loads
        if loads is None:
            return None
        rank = loads.rank(target.dp_rank)
        return rank.requests if rank is not None else loads.running_requests + loads.waiting_requests

    def kv_tokens(self, target: Target) -> int | None:
        """The KV-cache tokens in use that the engine's last `GetLoads` gave the worker's rank
        (its total for an unpinned worker); None when it did not say."""
        engine = self._engines.get(target.id)
        loads = engine.loads if engine is not None else None
        if loads is None:
            return None
        rank = loads.rank(target.dp_rank)
        return rank.used_tokens if rank is not None else loads.used_tokens

    def ready(self, targets: Sequence[Target]) -> bool:
        """Every healthy worker's model has its tokenizer (unless autoload is off, when a
        missing tokenizer is an operator's choice)."""
        healthy = [t for t in targets if t.models]
        if not healthy:
            return False
        if not self.tokenizers.autoload and not self._configured_tokenizer:
            return True
        return all(self.tokenizers.has(m) for t in healthy for m in t.models)

    def runtime_of(self, target: Target) -> str | None:
        engine = self._engines.get(target.id)
        return engine.runtime if engine is not None else target.runtime

    # requests

    async def handle(self, call: Call, pool: Sequence[Target], attempts: Attempts) -> AsyncGenerator[Event, None]:
        async for event in self.serve(call, pool, attempts, self._generate):
            yield event

    async def serve(
        self,
        call: Call,
        pool: Sequence[Target],
        attempts: Attempts,
        generate: GenerateStrategy,
        *,
        multimodal: bool = False,
    ) -> AsyncGenerator[Event, None]:
        """The request up to its first engine call: refusals, the rendered prompt, count_tokens
        and `max_tokens: 0` answered here; a generation is handed to `generate` (this
        connector's own attempt loop, or a disaggregated deployment's). `multimodal`: the
        deployment serves images (EPD), so a generation's images are fetched and preprocessed
        here and its prompt's placeholders expanded."""
        request = call.request
        generating = call.endpoint == "messages" and request.max_tokens > 0
        tokenizer = await self._tokenizer(call.model, pool)
        runtimes = {r for r in map(self.runtime_of, pool) if r}
        # The MLX refusals apply when any worker that could take the request is MLX.
        check_servable(request, "mlx" if "mlx" in runtimes else "", generating=generating, images=multimodal)
        windows = [t.context_windows[call.model] for t in pool if call.model in t.context_windows]
        # The window a prompt must certainly exceed to be refused untokenized: a generation's
        # worker is chosen later (the largest window may take it), `max_tokens: 0` answers
        # within the smallest; count_tokens counts whatever the length.
        within = None
        if windows and call.endpoint == "messages":
            within = max(windows) if generating else min(windows)
        if within is not None and len(call.raw) > _RENDER_INLINE_BYTES:
            # Refused before rendering when the user text alone cannot fit, whatever the template does.
            floor = prompt_token_floor(tokenizer, request)
            if floor > within:
                raise context_exceeded(within, floor, at_least=True)
        if len(call.raw) > _RENDER_INLINE_BYTES:
            # A long conversation renders for tens of milliseconds: not on the event loop.
            prompt = await asyncio.to_thread(render_prompt, tokenizer, request, within=within)
        else:
            prompt = render_prompt(tokenizer, request, within=within)
        entry = self.tokenizers.lookup(call.model)
        source = entry.source if entry is not None else None

        if call.endpoint == "count_tokens":
            # Answered by the gateway itself: no worker takes part.
            yield Routed(backend=self.name, worker=None, model=call.model, policy=None)
            yield Rendered(prompt_tokens=len(prompt.ids), prompt_digest=prompt.digest, tokenizer=source)
            yield Counted(input_tokens=len(prompt.ids))
            return

        message_id = new_message_id()
        if not generating:
            if windows and len(prompt.ids) > min(windows):
                raise context_exceeded(min(windows), len(prompt.ids))
            yield Routed(backend=self.name, worker=None, model=call.model, policy=None)
            settings = GenerationSettings(message_id=message_id, model=call.model, stream=call.stream)
            yield Rendered(
                prompt_tokens=len(prompt.ids),
                prompt_digest=prompt.digest,
                tokenizer=source,
                settings=settings_record(settings),
            )
            for payload in empty_message(message_id, call.model, len(prompt.ids)):
                yield Block(payload)
            return

        images: list[VisionItem] = []
        blocks = user_images(request) if multimodal else []
        if blocks:
            media = await load_images(self._media, blocks, self._config.media)
            processor = self._vision_processor()
            ids, images = await asyncio.to_thread(expand, prompt.ids, processor, media)
            prompt = replace(prompt, ids=ids)
        prepared = self._prepare(call, tokenizer, prompt, message_id, source)
        prepared.images = images
        async for event in generate(prepared, attempts):
            yield event

    def _vision_processor(self) -> QwenVlProcessor:
        if self._vision is None:
            self._vision = QwenVlProcessor.from_model_dir(self._config.model_path)
        return self._vision

    def _prepare(
        self, call: Call, tokenizer: Tokenizer, prompt: Prompt, message_id: str, source: str | None
    ) -> Prepared:
        request = call.request
        stops = list(request.stop_sequences or [])
        stop_ids = stop_token_map(tokenizer, stops)
        settings = GenerationSettings(
            message_id=message_id,
            model=call.model,
            stream=call.stream,
            stop_sequences=stops,
            stop_token_map=stop_ids,
            eos_token_ids=[],
        )
        plan = plan_output(
            request,
            prompt,
            call.model,
            tool_parser=self._config.tool_call_parser,
            reasoning_parser=self._config.reasoning_parser,
        )
        apply_plan(settings, plan, prompt.tools)
        return Prepared(call, tokenizer, prompt, message_id, source, settings, plan, stop_ids)

    def check_window(self, prepared: Prepared, worker: Target) -> None:
        """The prompt fits the worker's context window (when it advertises one)."""
        window = worker.context_windows.get(prepared.call.model)
        if window is not None and len(prepared.prompt.ids) > window:
            raise context_exceeded(window, len(prepared.prompt.ids))

    def engine_call(
        self, prepared: Prepared, engine: EngineWorker, request_id: str, dp_rank: int | None = None
    ) -> GenerateCall:
        """The engine call for one attempt on `engine` (`dp_rank`: the chosen worker's rank).
        Raises `ApiError` for what its runtime cannot serve."""
        plan = prepared.plan
        if plan.constraint is not None and engine.runtime == "mlx":
            raise ApiError(
                400,
                "Invalid request parameters: MLX backend does not support structured output constraint: "
                f"{plan.constraint[0]}",
                code="invalid_request_parameters",
            )
        engine_call = generate_call(
            prepared.call.request,
            prepared.prompt,
            request_id=request_id,
            runtime=engine.runtime,
            stop_ids=prepared.stop_ids,
            defaults=engine.sampling_defaults,
            stream=prepared.call.stream,
            constraint=plan.constraint,
            dp_rank=dp_rank,
        )
        engine_call.images = list(prepared.images)
        engine_call.merge_chunks = not prepared.settings.stop_sequences
        # An engine without a tokenizer (ZMQ) is told where to stop.
        engine_call.eos_token_ids = list(prepared.tokenizer.eos_token_ids)
        return engine_call

    def begin(self, prepared: Prepared, engine: EngineWorker, engine_call: GenerateCall) -> tuple[list[Event], Attempt]:
        """An attempt's state, and the `rendered` event before the first attempt's answers (the
        first engine's eos ids join the tokenizer's)."""
        events: list[Event] = []
        if prepared.generation is None:
            settings, plan = prepared.settings, prepared.plan
            eos = engine.info.eos_token_ids if engine.info else []
            settings.eos_token_ids = sorted(set(eos) | set(prepared.tokenizer.eos_token_ids))
            constraint = {"type": plan.constraint[0], "value": plan.constraint[1]} if plan.constraint else None
            events.append(
                Rendered(
                    prompt_tokens=len(prepared.prompt.ids),
                    prompt_digest=prepared.prompt.digest,
                    stop_ids=engine_call.stop_token_ids,
                    constraint=constraint,
                    tokenizer=prepared.source,
                    settings=settings_record(settings),
                )
            )
            prepared.generation = Generation(prepared.tokenizer, settings, build_stages(settings))
        return events, Attempt(prepared.generation, len(prepared.prompt.ids))

    async def _generate(self, prepared: Prepared, attempts: Attempts) -> AsyncGenerator[Event, None]:
        async for lease in attempts:
            worker = lease.target
            engine = await self._engine(worker)
            self.check_window(prepared, worker)
            message_id = prepared.message_id
            engine_request_id = message_id if lease.attempt == 1 else f"{message_id}-{lease.attempt}"
            engine_call = self.engine_call(prepared, engine, engine_request_id, worker.dp_rank)
            yield lease.routed
            events, attempt_state = self.begin(prepared, engine, engine_call)
            for event in events:
                yield event
            try:
                async for event in self.run(engine, engine_call, attempt_state):
                    yield event
            except EngineError as exc:
                err = engine_failure(exc, started=attempt_state.started)
                if exc.unavailable and not attempt_state.started:
                    log.warning("worker %s unreachable (%s)", worker.url, exc.message)
                    lease.failed(Failure("unavailable", err))
                    continue
                if exc.code == "UNAVAILABLE":
                    # The engine went away mid-answer: the worker is down until a health check passes.
                    lease.failed(Failure("unavailable", err, retryable=False))
                else:
                    lease.answered(err.status)
                yield error_event(err)
                return
            lease.answered(200)
            return

    async def engine_for(self, target: Target) -> EngineWorker:
        """The worker's engine client (connected on first use, its runtime detected if unknown)."""
        return await self._engine(target)

    async def run(
        self,
        engine: EngineWorker,
        engine_call: GenerateCall,
        attempt: Attempt,
        stream: AsyncIterator[EngineEvent] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """One engine call, its answers handed to `attempt` (`stream`: the call already
        started). `message_start` waits for the engine's first answer, so a refusal (a prompt
        the engine finds too long, bad parameters) is an ordinary error response. A call left
        before the engine settled it is aborted."""
        client = engine.client
        if stream is None:
            stream = client.generate(engine_call)
        settled = False  # the engine finished the request or refused it: nothing to abort
        try:
            async for item in stream:
                if isinstance(item, EngineChunk):
                    for event in attempt.chunk(item.token_ids, item.prompt_tokens, item.completion_tokens):
                        yield event
                    if attempt.stopped:
                        for event in attempt.stop():
                            yield event
                        return
                    continue
                assert isinstance(item, EngineDone)
                settled = True
                if item.finish_reason == "error":
                    # vLLM ends a request it could not run (a failed preprocessing or grammar
                    # compile, an empty completion) this way: a failure, never an empty success.
                    raise EngineError("INTERNAL", "the engine failed the request (finish reason: error)")
                for event in attempt.done(
                    item.token_ids,
                    item.finish_reason,
                    item.prompt_tokens,
                    item.completion_tokens,
                    matched_token_id=item.matched_token_id,
                    matched_stop_str=item.matched_stop_str,
                ):
                    yield event
                return
            raise EngineError("INTERNAL", "the engine closed the stream without completing the generation")
        except EngineError:
            settled = True
            raise
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            if not settled:
                self.abort(client, engine_call.request_id)

    def abort(self, client: EngineClient, request_id: str) -> None:
        """Tell the engine to stop; the request is over for us whether or not it confirms."""

        async def abort() -> None:
            try:
                await client.abort(request_id)
            except EngineError as exc:
                log.info("abort of %s not confirmed: %s", request_id, exc.message or exc.code)

        task = asyncio.get_running_loop().create_task(abort(), name=f"smg-abort-{request_id}")
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)


# The name the gRPC path has always had.
GrpcConnector = EngineConnector
