"""The gRPC worker backend: the gateway implements the Messages API itself.

For each request: the model must be served (404 first), its tokenizer ready (the registry's
three refusals), the conversation rendered and tokenized; count_tokens and `max_tokens: 0`
are answered here without a worker. Otherwise a worker is chosen, the prompt checked
against its context window, and the engine's token stream run through the sans-IO
`Generation`, yielding `rendered`, `tokens` and `block` events. A client that goes away
mid-generation has its engine request aborted.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import string
from collections.abc import AsyncGenerator
from dataclasses import asdict
from typing import Any

from journal.events import Block, Counted, Error, Event, Rendered, Routed
from smg.backends.base import Call, ModelCard, model_cards
from smg.backends.grpc.discovery import EngineWorker, check_health, discover, register_tokenizer
from smg.backends.grpc.request import (
    check_servable,
    engine_failure,
    generate_call,
    sampling_defaults,
    stop_token_map,
)
from smg.backends.grpc.types import EngineChunk, EngineDone, EngineError
from smg.config import GatewayConfig
from smg.pipeline.attempt import Attempt
from smg.pipeline.generation import Generation, GenerationSettings, empty_message
from smg.pipeline.output import apply_plan, build_stages, plan_output
from smg.pipeline.render import Prompt, render_prompt
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.protocol.errors import ApiError
from smg.routing.workers import Worker, WorkerRegistry

log = logging.getLogger("smg.grpc")

_ALPHANUMERIC = string.ascii_letters + string.digits
# Bodies up to this size render inline; the thread hop costs more than rendering them.
_RENDER_INLINE_BYTES = 16_384


def new_message_id() -> str:
    return "msg_" + "".join(_ALPHANUMERIC[b % 62] for b in secrets.token_bytes(24))


def context_exceeded(limit: int, tokens: int) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {limit} tokens. However, your request has {tokens} input "
        "tokens. Please reduce the length of the input.",
        code="context_length_exceeded",
    )


def settings_record(settings: GenerationSettings) -> dict[str, Any]:
    """The settings as the journal keeps them (JSON object keys are strings)."""
    record = asdict(settings)
    record["stop_token_map"] = {str(k): v for k, v in settings.stop_token_map.items()}
    return record


class GrpcBackend:
    """Serves Messages and count_tokens from gRPC inference engines."""

    name = "grpc"

    def __init__(
        self,
        config: GatewayConfig,
        registry: WorkerRegistry,
        urls: list[str],
        tokenizers: TokenizerRegistry | None = None,
    ) -> None:
        self._config = config
        self._registry = registry
        self._urls = urls
        self.tokenizers = tokenizers or TokenizerRegistry(autoload=config.tokenizer_autoload)
        self._engines: dict[str, EngineWorker] = {}
        self._watch: asyncio.Task[None] | None = None
        self._aborts: set[asyncio.Task[None]] = set()
        self._configured_tokenizer = config.tokenizer_path or config.model_path
        self._chat_template = str(config.chat_template) if config.chat_template else None

    # lifecycle

    async def start(self) -> None:
        for url in self._urls:
            worker = self._registry.add(Worker(url=url, kind="grpc"))
            # Without --backend each engine's runtime is detected when it is first discovered.
            self._engines[url] = EngineWorker(worker=worker, runtime=self._config.backend)
        await asyncio.gather(*(self._discover(e) for e in self._engines.values()))
        self._watch = asyncio.create_task(self._watch_workers(), name="smg-grpc-health")

    async def close(self) -> None:
        if self._watch:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await asyncio.gather(*self._aborts, return_exceptions=True)
        await self.tokenizers.close()
        clients = [e.client for e in self._engines.values() if e.client is not None]
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    async def _discover(self, engine: EngineWorker) -> None:
        if not await discover(engine):
            return
        assert engine.info is not None
        engine.sampling_defaults = sampling_defaults(engine.info.default_sampling)
        await register_tokenizer(
            engine,
            self.tokenizers,
            configured_path=self._configured_tokenizer,
            chat_template=self._chat_template,
        )

    async def _watch_workers(self) -> None:
        interval = self._config.health_check_interval_secs
        tick = min(2.0, interval)
        elapsed = 0.0
        while True:
            await asyncio.sleep(tick)
            elapsed += tick
            full_round = elapsed >= interval
            if full_round:
                elapsed = 0.0
            for engine in list(self._engines.values()):
                # Undiscovered or down workers are probed every tick, the rest each interval.
                if not engine.worker.discovered or (full_round and engine.info is not None):
                    await self._discover(engine)
                elif not engine.worker.healthy:
                    await check_health(engine)

    def models(self) -> list[ModelCard]:
        return model_cards(w for w in self._registry.all() if w.kind == "grpc")

    def ready(self) -> bool:
        """Some worker is up, and every healthy worker's model has its tokenizer (unless
        autoload is off, when a missing tokenizer is an operator's choice)."""
        healthy = [w for w in self._registry.all() if w.kind == "grpc" and w.healthy and w.models]
        if not healthy:
            return False
        if not self.tokenizers.autoload and not self._configured_tokenizer:
            return True
        return all(self.tokenizers.has(m) for w in healthy for m in w.models)

    # requests

    def _served_by(self, model: str) -> list[Worker]:
        workers = self._registry.candidates(model)
        if workers:
            return workers
        # Raises the registry's refusal: 404, or 503 while some worker is still unknown.
        self._registry.select(model)
        raise AssertionError("unreachable: select() found a worker candidates() did not")

    async def handle(self, call: Call) -> AsyncGenerator[Event, None]:
        request = call.request
        generating = call.endpoint == "messages" and request.max_tokens > 0
        workers = self._served_by(call.model)
        tokenizer = self.tokenizers.get(call.model)
        for runtime in self._runtimes(workers):
            check_servable(request, runtime, generating=generating)
        if len(call.raw) > _RENDER_INLINE_BYTES:
            # A long conversation renders for tens of milliseconds: not on the event loop.
            prompt = await asyncio.to_thread(render_prompt, tokenizer, request)
        else:
            prompt = render_prompt(tokenizer, request)
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
            windows = [w.context_windows[call.model] for w in workers if call.model in w.context_windows]
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

        async for event in self._generate(call, tokenizer, prompt, message_id, source):
            yield event

    async def _generate(
        self, call: Call, tokenizer: Tokenizer, prompt: Prompt, message_id: str, source: str | None
    ) -> AsyncGenerator[Event, None]:
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
        if plan.constraint is not None and "mlx" in self._runtimes(self._served_by(call.model)):
            raise ApiError(
                400,
                "Invalid request parameters: MLX backend does not support structured output constraint: "
                f"{plan.constraint[0]}",
                code="invalid_request_parameters",
            )
        apply_plan(settings, plan, prompt.tools)
        retry = self._config.retry
        max_attempts = 1 + (retry.max_retries if retry else 0)
        tried: set[str] = set()
        generation: Generation | None = None
        for attempt in range(1, max_attempts + 1):
            worker = self._pick(call.model, tried)
            tried.add(worker.url)
            engine = self._engines[worker.url]
            window = worker.context_windows.get(call.model)
            if window is not None and len(prompt.ids) > window:
                raise context_exceeded(window, len(prompt.ids))
            engine_request_id = message_id if attempt == 1 else f"{message_id}-{attempt}"
            engine_call = generate_call(
                request,
                prompt,
                request_id=engine_request_id,
                runtime=engine.runtime or "",
                stop_ids=stop_ids,
                defaults=engine.sampling_defaults,
                stream=call.stream,
                constraint=plan.constraint,
            )
            yield Routed(backend=self.name, worker=worker.url, model=call.model, policy="round_robin", attempt=attempt)
            if generation is None:
                eos = engine.info.eos_token_ids if engine.info else []
                settings.eos_token_ids = sorted(set(eos) | set(tokenizer.eos_token_ids))
                constraint = {"type": plan.constraint[0], "value": plan.constraint[1]} if plan.constraint else None
                yield Rendered(
                    prompt_tokens=len(prompt.ids),
                    prompt_digest=prompt.digest,
                    stop_ids=engine_call.stop_token_ids,
                    constraint=constraint,
                    tokenizer=source,
                    settings=settings_record(settings),
                )
                generation = Generation(tokenizer, settings, build_stages(settings))
            attempt_state = Attempt(generation, len(prompt.ids))
            try:
                async for event in self._run(engine, engine_call, attempt_state):
                    yield event
            except EngineError as exc:
                if exc.unavailable:
                    worker.record_failure(exc.message or exc.code, refused=True)
                if exc.unavailable and not attempt_state.started and attempt < max_attempts:
                    log.warning("worker %s unreachable (%s); retrying elsewhere", worker.url, exc.message)
                    continue
                err = engine_failure(exc, started=attempt_state.started)
                yield Error(
                    stage="engine",
                    status=err.status,
                    error_type=err.type,
                    message=err.message,
                    code=err.code,
                    headers=err.response_headers(),
                )
                return
            worker.record_success()
            return

    def _runtimes(self, workers: list[Worker]) -> set[str]:
        """The runtimes of `workers` (a model's workers are discovered, so their runtime is known)."""
        return {r for r in (self._engines[w.url].runtime for w in workers) if r is not None}

    def _pick(self, model: str, tried: set[str]) -> Worker:
        return self._registry.select(model, frozenset(tried))

    async def _run(self, engine: EngineWorker, engine_call: Any, attempt: Attempt) -> AsyncGenerator[Event, None]:
        """One engine call, its answers handed to `attempt`. `message_start` waits for the
        engine's first answer, so a refusal (a prompt the engine finds too long, bad
        parameters) is an ordinary error response."""
        client = engine.client
        assert client is not None  # a worker is picked only once discovered
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
                self._abort(client, engine_call.request_id)

    def _abort(self, client: Any, request_id: str) -> None:
        """Tell the engine to stop; the request is over for us whether or not it confirms."""

        async def abort() -> None:
            try:
                await client.abort(request_id)
            except EngineError as exc:
                log.info("abort of %s not confirmed: %s", request_id, exc.message or exc.code)

        task = asyncio.get_running_loop().create_task(abort(), name=f"smg-abort-{request_id}")
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)
