"""What a generation with images keeps for its attempts, over playback engines in-process: the
pixels only for a pool whose engines take them, the images' own bytes only for one whose
engines take those (TRT-LLM)."""

from __future__ import annotations

import functools

import pytest

from smg.backends.grpc.engines.playback import Playbook
from smg.backends.grpc.types import GenerateCall
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from tests.grpc.test_images import QWEN2VL, TALL, WIDE
from tests.grpc.test_images import body as image_body
from tests.inprocess import Leases, call, config, connector, discovered, engine, served

A = "grpc://127.0.0.1:50001"


@functools.cache
def qwen2vl() -> Tokenizer:
    return Tokenizer.load(QWEN2VL)


async def _received(runtime: str) -> list[GenerateCall]:
    book = Playbook()
    book.add(A, engine(runtime=runtime, tokenizer=qwen2vl()))
    conn = connector(config(A, model_path=str(QWEN2VL)), book)
    pool = await discovered(conn, A)
    book.engines[A].script({"text": "Two pictures."})
    try:
        await served(conn, call({**image_body(), "model": "qwen3-fixture"}), pool, Leases(pool))
    finally:
        await conn.close()
    return list(book.engines[A].received)


async def test_a_trtllm_pool_keeps_the_images_bytes_and_no_pixels() -> None:
    (sent,) = await _received("trtllm")
    assert sent.image_data == [WIDE, TALL]
    # TRT-LLM's own input processor encodes the bytes: pixels held through the generation would
    # be tens of MB per image for nothing.
    assert sent.images == []


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
async def test_a_pool_that_takes_pixels_keeps_them_and_no_bytes(runtime: str) -> None:
    (sent,) = await _received(runtime)
    assert len(sent.images) == 2
    assert all(image.pixel_values.data for image in sent.images)
    assert sent.image_data == []
