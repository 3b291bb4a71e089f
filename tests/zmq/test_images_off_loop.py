"""A ZMQ request's images are encoded (their pixels cast to the engine's dtype, hundreds of
milliseconds for a large image) off the event loop, so no other stream waits for them: a real
client in the test's loop, a scripted EngineCore process on the real wire, and a profiler hook
that notes the thread `mm_features` runs on."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from smg.backends.grpc.types import EngineDone, GenerateCall
from smg.backends.zmq import features
from smg.backends.zmq.client import ZmqEngineClient
from smg.pipeline.media import MediaItem
from smg.pipeline.vision import expand, processor_for
from tests.grpc.test_images import TALL
from tests.threads import threads_calling
from tests.zmq.conftest import FIXTURES, socket_dir, target_of
from tools.engine_control import EngineControl
from tools.spawn import spawn_zmq_engine

QWEN2VL = FIXTURES / "qwen2vl"


async def _serving(client: ZmqEngineClient, timeout: float = 30.0) -> None:
    """Until the engine dialled in and registered (the transport has no event for it)."""
    client.transport.start()
    deadline = time.monotonic() + timeout
    while not client.transport.serving:
        assert time.monotonic() < deadline, client.transport.waiting_reason()
        await asyncio.sleep(0.05)


async def test_a_requests_images_are_encoded_off_the_event_loop() -> None:
    directory = socket_dir()
    path = directory / "w0"
    engine = spawn_zmq_engine(path, QWEN2VL)
    control = EngineControl(target_of(engine.url))
    client = ZmqEngineClient(f"ipc://{path}", model_id=str(QWEN2VL))
    # Threads started from here on carry the hook (threading.setprofile reaches new threads only).
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
    try:
        await _serving(client)
        control.script({"text": "ok"})
        processor = processor_for(QWEN2VL)
        ids, images = expand([1, processor.placeholder_token_id, 2], processor, [MediaItem(TALL, "image/png")])
        call = GenerateCall(request_id="off-loop-1", input_ids=ids, max_tokens=4, images=images)
        with threads_calling(features.mm_features.__code__) as encoded_on:
            events = [event async for event in client.generate(call)]
        assert isinstance(events[-1], EngineDone)
        (received,) = control.received()
        assert len(received["mm_features"]) == 1  # the engine decoded the image
        assert encoded_on, "mm_features never ran"
        assert threading.get_ident() not in encoded_on
    finally:
        await client.close()
        control.close()
        engine.stop()
        shutil.rmtree(directory, ignore_errors=True)
