"""Images on a plain SGLang or vLLM gRPC pool: preprocessed by the gateway (the Qwen2-VL-typed
fixture model) and sent in the request's `mm_inputs`, checked against what the scripted engine
received over loopback and against `transformers`' own processor on the same images."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from replay.offline import check
from tests.conftest import wait_for_events
from tests.grpc.conftest import FIXTURES, target_of
from tests.grpc.test_pd import sse_events
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway

QWEN2VL = FIXTURES / "qwen2vl"
MODEL = "vl-fixture"
IMAGE_TOKEN = 4006  # <|image_pad|>, config.json's image_token_id


def png(height: int, width: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


WIDE, TALL = png(60, 130, 1), png(90, 40, 2)


@dataclass
class Pool:
    runtime: str
    gateway: Spawned
    journal: Path
    control: EngineControl


def reference_processor() -> Any:
    """transformers' processor for the fixture's preprocessor config: what the engine must get."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12544, patch_size=14, merge_size=2)


def spawn_pool(runtime: str, journal: Path, extra: tuple[str, ...] = ()) -> Iterator[Pool]:
    """A scripted `runtime` engine serving the Qwen2-VL fixture and a gateway in front of it."""
    engine = spawn_engine(runtime, model_path=QWEN2VL, extra=["--served-model-name", MODEL])
    gateway: Spawned | None = None
    control = EngineControl(target_of(engine.url))
    try:
        gateway = spawn_gateway([engine.url], journal=journal, extra=["--model-path", str(QWEN2VL), *extra])
        yield Pool(runtime, gateway, journal, control)
    finally:
        if gateway is not None:
            gateway.stop()
        control.close()
        engine.stop()


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    runtime = str(request.param)
    yield from spawn_pool(runtime, tmp_path_factory.mktemp(f"images-{runtime}") / "journal.db")


def image_block(data: bytes) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()},
    }


def body(stream: bool = False) -> dict[str, Any]:
    content = [image_block(WIDE), {"type": "text", "text": "and"}, image_block(TALL)]
    return {"model": MODEL, "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": content}]}


def tensor(value: dict[str, Any], runtime: str) -> np.ndarray[Any, Any]:
    raw = base64.b64decode(value["data" if runtime == "sglang" else "inline"])
    dtype = "<f4" if value["dtype"] == "float32" else "<i8"
    return np.frombuffer(raw, dtype=dtype).reshape([int(d) for d in value["shape"]])


def runs(ids: list[int]) -> list[tuple[int, int]]:
    """(offset, length) of each run of image tokens."""
    out: list[tuple[int, int]] = []
    for i, token in enumerate(ids):
        if token == IMAGE_TOKEN:
            if out and out[-1][0] + out[-1][1] == i:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((i, 1))
    return out


def test_images_reach_the_engine_preprocessed_with_their_placeholders(pool: Pool) -> None:
    pool.control.reset()
    pool.control.script({"text": "Two pictures."})
    reply = httpx.post(pool.gateway.url + "/v1/messages", json=body(), timeout=30.0)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == [{"type": "text", "text": "Two pictures."}]
    (received,) = pool.control.received()
    ids = [int(t) for t in received["tokenized"]["input_ids"]]
    mm = received["mm_inputs"]
    reference = reference_processor()(
        images=[Image.open(io.BytesIO(WIDE)), Image.open(io.BytesIO(TALL))], return_tensors="np"
    )
    grids = reference["image_grid_thw"]
    lengths = [int(g.prod()) // 4 for g in grids]
    placeholders = [(int(p.get("offset", 0)), int(p["length"])) for p in mm["mm_placeholders"]]
    assert runs(ids) == placeholders and [n for _, n in placeholders] == lengths
    assert reply.json()["usage"]["input_tokens"] == len(ids)
    assert int(mm["im_token_id"]) == IMAGE_TOKEN
    pixels = tensor(mm["pixel_values"], pool.runtime)
    assert pixels.shape == reference["pixel_values"].shape
    assert np.allclose(pixels, reference["pixel_values"], atol=1e-5)
    tensors = mm["model_specific_tensors"]
    assert np.array_equal(tensor(tensors["image_grid_thw"], pool.runtime), grids)
    assert tensor(tensors["patches_per_image"], pool.runtime).tolist() == [int(g.prod()) for g in grids]
    if pool.runtime == "vllm":
        assert mm["mm_hashes"] == [hashlib.sha256(d).hexdigest() for d in (WIDE, TALL)]
        assert mm["flat_keys"] == {"pixel_values": "patches_per_image"}
        assert sorted(mm["batched_keys"]) == ["image_grid_thw", "patches_per_image"]
    else:
        assert mm["modalities"] == ["image", "image"]
    events = wait_for_events(pool.journal, reply.headers["x-request-id"])
    report = check(events)
    assert report.identical and not report.partial, report.differences


def test_a_streamed_image_request_completes(pool: Pool) -> None:
    pool.control.reset()
    pool.control.script({"text": "Streamed."})
    with httpx.stream("POST", pool.gateway.url + "/v1/messages", json=body(stream=True), timeout=30.0) as reply:
        assert reply.status_code == 200
        events = sse_events(reply.read().decode())
    assert events[-1][0] == "message_stop"
    text = "".join(e[1]["delta"].get("text", "") for e in events if e[0] == "content_block_delta")
    assert text == "Streamed."
    (received,) = pool.control.received()
    assert len(received["mm_inputs"]["mm_placeholders"]) == 2


def test_an_undecodable_image_is_refused_before_the_engine(pool: Pool) -> None:
    pool.control.reset()
    bad = {
        **body(),
        "messages": [{"role": "user", "content": [image_block(b"not an image"), {"type": "text", "text": "?"}]}],
    }
    reply = httpx.post(pool.gateway.url + "/v1/messages", json=bad, timeout=30.0)
    assert reply.status_code == 400
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert reply.json()["type"] == "error"
    assert pool.control.received() == []


def test_count_tokens_counts_each_image_as_its_one_placeholder(pool: Pool) -> None:
    pool.control.reset()
    pool.control.script({"text": "ok"})
    counted = httpx.post(pool.gateway.url + "/v1/messages/count_tokens", json=body(), timeout=30.0)
    assert counted.status_code == 200, counted.text
    assert pool.control.received() == []  # answered by the gateway, nothing fetched or sent
    reply = httpx.post(pool.gateway.url + "/v1/messages", json=body(), timeout=30.0)
    (received,) = pool.control.received()
    expanded = sum(int(p["length"]) for p in received["mm_inputs"]["mm_placeholders"])
    assert counted.json()["input_tokens"] == reply.json()["usage"]["input_tokens"] - expanded + 2


def test_more_images_than_the_family_takes_are_refused_before_the_engine(pool: Pool) -> None:
    pool.control.reset()
    content = [image_block(TALL)] * 11 + [{"type": "text", "text": "?"}]  # Qwen-VL takes 10
    reply = httpx.post(
        pool.gateway.url + "/v1/messages",
        json={**body(), "messages": [{"role": "user", "content": content}]},
        timeout=30.0,
    )
    assert reply.status_code == 400, reply.text
    assert reply.headers["x-smg-error-code"] == "invalid_multimodal_request"
    assert "at most 10 image inputs; got 11" in reply.json()["error"]["message"]
    assert pool.control.received() == []
    events = wait_for_events(pool.journal, reply.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]
