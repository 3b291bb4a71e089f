"""A request's way to its first engine call: the waiting around the pure prepare step.

For each request (the router has checked that the model is served): its tokenizer (waited for
while it loads), the refusals of what the engine path cannot serve, the conversation rendered
(a long one on a thread) and tokenized; count_tokens and `max_tokens: 0` are answered here
without a worker. A generation on a pool that serves images (SGLang, vLLM and TRT-LLM workers,
vLLM ZMQ workers for the families their connector sends, an EPD deployment) has its images
fetched and preprocessed here by the model's family processor, before any worker is chosen, and
its prompt's placeholders expanded (`smg.pipeline.media`, `smg.pipeline.vision`); their bytes are
kept as well when a TRT-LLM worker may take the request, and their pixels only when a worker that
takes pixels may. What is decided is
`smg.pipeline.prepare`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

from journal.events import Event
from smg.backends.base import Call, Target
from smg.backends.grpc.request import RAW_IMAGE_RUNTIMES, check_servable
from smg.backends.grpc.workers import EngineWorkers
from smg.config import GatewayConfig
from smg.fetch import Fetcher
from smg.pipeline.media import load_images, user_images
from smg.pipeline.prepare import (
    RENDER_INLINE_BYTES,
    Prepared,
    check_untokenized,
    count_answer,
    empty_answer,
    prepare,
    refusal_window,
)
from smg.pipeline.render import render_prompt
from smg.pipeline.vision import ImageProcessor, VisionItem, check_count, expand, processor_for
from smg.protocol.errors import ApiError
from smg.protocol.ids import random_id


def new_message_id() -> str:
    return random_id("msg_")


class Front:
    """Prepares requests for one connector (`backend`: its journal name)."""

    def __init__(
        self,
        config: GatewayConfig,
        workers: EngineWorkers,
        backend: str,
        *,
        image_runtimes: frozenset[str],
        sends_images: Callable[[ImageProcessor], bool] | None = None,
    ) -> None:
        self._config = config
        self._image_runtimes = image_runtimes  # the runtimes whose requests this connector sends images on
        self._sends_images = sends_images  # the families it sends (unset: every one with a processor)
        self._workers = workers
        self._backend = backend
        self._media = Fetcher(config.fetch.policy())  # fetches image URLs (EPD)
        self._vision: ImageProcessor | None = None
        self._no_vision = False  # the model has no image processor (a text model)

    async def close(self) -> None:
        await self._media.aclose()

    async def take(
        self, call: Call, pool: Sequence[Target], *, multimodal: bool | None = None, backend: str | None = None
    ) -> list[Event] | Prepared:
        """The gateway's own answer (count_tokens, `max_tokens: 0`) as events, or the prepared
        generation. Raises `ApiError` for a refusal. `multimodal`: the deployment serves images
        (unset: the pool does when every worker's runtime takes them and the model has an image
        processor; otherwise its images are refused as not supported).
        `backend`: the journal name of the connector serving the request when it is not this
        front's own (a disaggregated pool sharing the gRPC connector's front)."""
        request = call.request
        generating = call.endpoint == "messages" and request.max_tokens > 0
        tokenizer = await self._workers.tokenizer(call.model, pool)
        runtimes = {r for r in map(self._workers.runtime_of, pool) if r}
        if multimodal is None:
            takes = bool(runtimes) and runtimes <= self._image_runtimes
            multimodal = takes and generating and bool(user_images(request)) and self._model_takes_images()
        # The MLX refusals apply when any worker that could take the request is MLX.
        check_servable(request, "mlx" if "mlx" in runtimes else "", generating=generating, images=multimodal)
        windows = [t.context_windows[call.model] for t in pool if call.model in t.context_windows]
        within = refusal_window(windows, endpoint=call.endpoint, generating=generating)
        check_untokenized(tokenizer, request, within, len(call.raw))
        if len(call.raw) > RENDER_INLINE_BYTES:
            # A long conversation renders for tens of milliseconds: not on the event loop.
            prompt = await asyncio.to_thread(render_prompt, tokenizer, request, within=within)
        else:
            prompt = render_prompt(tokenizer, request, within=within)
        source = self._workers.tokenizer_source(call.model)
        if call.endpoint == "count_tokens":
            return count_answer(backend or self._backend, call.model, prompt, source)
        message_id = new_message_id()
        if not generating:
            return empty_answer(backend or self._backend, call.model, call.stream, prompt, source, message_id, windows)
        images: list[VisionItem] = []
        image_data: list[bytes] = []
        blocks = user_images(request) if multimodal else []
        if blocks:
            processor = self._vision_processor()
            if len(blocks) <= self._config.media.max_items:  # past it, `load_images` refuses first
                check_count(processor, len(blocks), self._config.media.image_limit)
            media = await load_images(self._media, blocks, self._config.media)
            ids, images = await asyncio.to_thread(expand, prompt.ids, processor, media)
            prompt = replace(prompt, ids=ids)
            if runtimes & RAW_IMAGE_RUNTIMES:
                image_data = [item.data for item in media]
            if runtimes and runtimes <= RAW_IMAGE_RUNTIMES:
                # No worker of the pool takes pixels: kept for every attempt, they would hold
                # megabytes per image through the whole generation for nothing.
                images = []
        return prepare(
            request,
            call.model,
            call.stream,
            tokenizer,
            prompt,
            message_id,
            source,
            tool_parser=self._config.tool_call_parser,
            reasoning_parser=self._config.reasoning_parser,
            images=images,
            image_data=image_data,
        )

    def _model_takes_images(self) -> bool:
        if self._vision is None and not self._no_vision:
            try:
                self._vision = processor_for(self._config.model_path)
            except ApiError:
                self._no_vision = True
        if self._vision is None:
            return False
        return self._sends_images is None or self._sends_images(self._vision)

    def _vision_processor(self) -> ImageProcessor:
        if self._vision is None:
            self._vision = processor_for(self._config.model_path)
        return self._vision
