"""Images on a vLLM ZMQ pool: preprocessed by the gateway (the Qwen2-VL-typed fixture model) and
sent as the EngineCoreRequest's `mm_features`, their tensors in frames after the payload; checked
against what the scripted EngineCore decoded over loopback and against `transformers`' own
processor on the same images. A TokenSpeed pool, whose requests carry no images, refuses them."""

from __future__ import annotations

import hashlib
import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from replay.offline import check
from tests.conftest import wait_for_events
from tests.grpc.test_images import IMAGE_TOKEN, TALL, WIDE, body, image_block, runs
from tests.grpc.test_pd import sse_events
from tests.zmq.conftest import FIXTURES, socket_dir, target_of, wait_ready
from tools.engine_control import EngineControl
from tools.spawn import spawn_gateway, spawn_zmq_engine

QWEN2VL = FIXTURES / "qwen2vl"
BF16_RTOL = 2.0**-8  # the scripted engine says its dtype is bfloat16: pixels are sent rounded to it


def deploy(
    directory: Path, journal: Path, runtime: str, env: dict[str, str] | None = None
) -> Iterator[tuple[httpx.Client, EngineControl, Path]]:
    path = directory / "w0"
    gateway = spawn_gateway(
        [f"ipc://{path}"], journal=journal, env=env,
        extra=["--backend", runtime, "--model-path", str(QWEN2VL), "--model-alias", f"vl-fixture={QWEN2VL}"],
    )
    engine = None
    try:
        engine = spawn_zmq_engine(path, QWEN2VL, ["--runtime", runtime])
        control = EngineControl(target_of(engine.url))
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            wait_ready(client)
            yield client, control, journal
        control.close()
    finally:
        if engine is not None:
            engine.stop()
        gateway.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, EngineControl, Path]]:
    yield from deploy(socket_dir(), tmp_path_factory.mktemp("zmq-images") / "journal.db", "vllm")


def values(tensor: dict[str, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(tensor["values"])


def test_images_reach_the_engine_as_mm_features(deployment: tuple[httpx.Client, EngineControl, Path]) -> None:
    from transformers import Qwen2VLImageProcessorPil

    client, control, journal = deployment
    control.reset()
    control.script({"text": "Two pictures."})
    reply = client.post("/v1/messages", json=body())
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == [{"type": "text", "text": "Two pictures."}]
    (received,) = control.received()
    ids = [int(t) for t in received["prompt_token_ids"]]
    reference = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12544, patch_size=14, merge_size=2)(
        images=[Image.open(io.BytesIO(WIDE)), Image.open(io.BytesIO(TALL))], return_tensors="np"
    )
    grids = reference["image_grid_thw"]
    patches = [int(g.prod()) for g in grids]
    features = received["mm_features"]
    placeholders = [(f["mm_position"]["offset"], f["mm_position"]["length"]) for f in features]
    assert runs(ids) == placeholders and [n for _, n in placeholders] == [p // 4 for p in patches]
    assert all(f["mm_position"]["is_embed"] is None for f in features)  # every position is <|image_pad|>
    assert reply.json()["usage"]["input_tokens"] == len(ids)
    hashes = [hashlib.sha256(d).hexdigest() for d in (WIDE, TALL)]
    assert [(f["modality"], f["identifier"], f["mm_hash"]) for f in features] == [("image", h, h) for h in hashes]
    slices = [[0, patches[0], None], [patches[0], patches[0] + patches[1], None]]
    start = 0
    for feature, grid, count in zip(features, grids, patches, strict=True):
        pixels, grid_thw = feature["data"]["pixel_values"], feature["data"]["image_grid_thw"]
        assert sorted(feature["data"]) == ["image_grid_thw", "pixel_values"]
        # vLLM's Qwen2-VL layout: pixels flat by each image's patch count, the grid batched on the CPU.
        assert pixels["field"] == ["flat", {"keep_on_cpu": False, "slices": slices, "dim": 0}]
        assert grid_thw["field"] == ["batched", {"keep_on_cpu": True}]
        assert pixels["dtype"] == "bfloat16" and grid_thw["dtype"] == "int64"
        expected = reference["pixel_values"][start : start + count]
        assert np.allclose(values(pixels), expected, rtol=BF16_RTOL, atol=1e-6)
        assert values(grid_thw).tolist() == grid.tolist()
        start += count
    assert received["frames"] == 3  # the payload and each image's pixels (the grids travel inline)
    assert IMAGE_TOKEN in ids
    events = wait_for_events(journal, reply.headers["x-request-id"])
    report = check(events)
    assert report.identical and not report.partial, report.differences


def test_a_streamed_image_request_completes(deployment: tuple[httpx.Client, EngineControl, Path]) -> None:
    client, control, _ = deployment
    control.reset()
    control.script({"text": "Streamed."})
    with client.stream("POST", "/v1/messages", json=body(stream=True)) as reply:
        assert reply.status_code == 200
        events = sse_events(reply.read().decode())
    assert events[-1][0] == "message_stop"
    text = "".join(e[1]["delta"].get("text", "") for e in events if e[0] == "content_block_delta")
    assert text == "Streamed."
    (received,) = control.received()
    assert len(received["mm_features"]) == 2


def test_an_undecodable_image_is_refused_before_the_engine(
    deployment: tuple[httpx.Client, EngineControl, Path],
) -> None:
    client, control, journal = deployment
    control.reset()
    content = [image_block(b"not an image"), {"type": "text", "text": "?"}]
    bad = {**body(), "messages": [{"role": "user", "content": content}]}
    reply = client.post("/v1/messages", json=bad)
    assert reply.status_code == 400
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert reply.json()["type"] == "error"
    assert control.received() == []
    events = wait_for_events(journal, reply.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]


def test_count_tokens_counts_each_image_as_its_one_placeholder(
    deployment: tuple[httpx.Client, EngineControl, Path],
) -> None:
    client, control, _ = deployment
    control.reset()
    control.script({"text": "ok"})
    counted = client.post("/v1/messages/count_tokens", json=body())
    assert counted.status_code == 200, counted.text
    assert control.received() == []  # answered by the gateway, nothing fetched or sent
    reply = client.post("/v1/messages", json=body())
    (received,) = control.received()
    expanded = sum(f["mm_position"]["length"] for f in received["mm_features"])
    assert counted.json()["input_tokens"] == reply.json()["usage"]["input_tokens"] - expanded + 2


def test_a_text_request_sends_no_mm_features(deployment: tuple[httpx.Client, EngineControl, Path]) -> None:
    client, control, _ = deployment
    control.reset()
    control.script({"text": "ok"})
    reply = client.post(
        "/v1/messages", json={"model": "vl-fixture", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert reply.status_code == 200, reply.text
    (received,) = control.received()
    assert received["mm_features"] is None and received["frames"] == 1


@pytest.fixture(scope="module")
def tokenspeed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, EngineControl, Path]]:
    yield from deploy(socket_dir(), tmp_path_factory.mktemp("zmq-ts-images") / "journal.db", "tokenspeed")


def test_images_on_a_tokenspeed_pool_are_not_supported(
    tokenspeed: tuple[httpx.Client, EngineControl, Path],
) -> None:
    client, control, journal = tokenspeed
    control.reset()
    reply = client.post("/v1/messages", json=body())
    assert reply.status_code == 400, reply.text
    assert reply.headers["x-smg-error-code"] == "multimodal_not_supported"
    assert reply.json()["type"] == "error"
    assert control.received() == []
    events = wait_for_events(journal, reply.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]


@pytest.fixture(scope="module")
def raised_limit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, EngineControl, Path]]:
    journal = tmp_path_factory.mktemp("zmq-image-limit") / "journal.db"
    yield from deploy(socket_dir(), journal, "vllm", env={"SMG_IMAGE_MAX_COUNT": "12"})


def test_smg_image_max_count_replaces_the_familys_limit(
    raised_limit: tuple[httpx.Client, EngineControl, Path],
) -> None:
    client, control, journal = raised_limit
    control.reset()
    control.script({"text": "ok", "repeat": True})

    def ask(count: int) -> httpx.Response:
        content = [image_block(TALL)] * count + [{"type": "text", "text": "?"}]
        return client.post("/v1/messages", json={**body(), "messages": [{"role": "user", "content": content}]})

    taken = ask(11)  # Qwen-VL's own limit is 10
    assert taken.status_code == 200, taken.text
    (received,) = control.received()
    assert len(received["mm_features"]) == 11
    refused = ask(13)
    assert refused.status_code == 400, refused.text
    assert refused.headers["x-smg-error-code"] == "invalid_multimodal_request"
    assert "at most 12 image inputs; got 13" in refused.json()["error"]["message"]
    assert len(control.received()) == 1
    events = wait_for_events(journal, refused.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]
