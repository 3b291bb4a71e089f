"""A gRPC request that carries images (TRT-LLM's bytes, vLLM's and SGLang's pixels: tens of MB
to copy into the message) is serialized off the event loop, so no other stream waits for it: a
real client in the test's loop, a scripted engine process, and a profiler hook that notes the
thread the request is built on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from smg.backends.grpc.engines import CLIENTS
from smg.backends.grpc.types import EngineDone, GenerateCall
from smg.pipeline.media import MediaItem
from smg.pipeline.vision import expand, processor_for
from tests.grpc.conftest import target_of
from tests.grpc.test_images import QWEN2VL, TALL
from tests.threads import threads_calling
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine


@pytest.fixture(params=["trtllm", "vllm"])
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, Spawned]]:
    runtime = str(request.param)
    spawned = spawn_engine(runtime, model_path=QWEN2VL)
    try:
        yield runtime, spawned
    finally:
        spawned.stop()


async def test_a_request_with_images_is_built_off_the_event_loop(engine: tuple[str, Spawned]) -> None:
    runtime, spawned = engine
    cls = CLIENTS[runtime]
    client = cls(target_of(spawned.url))
    control = EngineControl(target_of(spawned.url))
    # Threads started from here on carry the hook (threading.setprofile reaches new threads only).
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
    try:
        control.script({"text": "ok"})
        processor = processor_for(QWEN2VL)
        media = [MediaItem(TALL, "image/png")]
        ids, images = expand([1, processor.placeholder_token_id, 2], processor, media)
        call = GenerateCall(request_id="off-loop-1", input_ids=ids, max_tokens=4)
        if runtime == "trtllm":
            call.image_data = [TALL]
        else:
            call.images = images
        with threads_calling(cls.generate_request.__code__) as built_on:
            events = [event async for event in client.generate(call)]
        assert isinstance(events[-1], EngineDone)
        assert len(control.received()) == 1
        assert built_on, "generate_request never ran"
        assert threading.get_ident() not in built_on
    finally:
        await client.close()
        control.close()
