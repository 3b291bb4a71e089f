"""Images on a TokenSpeed gRPC pool (no EPD): each image goes as one `mm_inputs` item with its
pixels as the encoder input, its grid, hash and placeholder range; scripted engine as a real
process."""

from __future__ import annotations

import hashlib
import io
from base64 import b64decode
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from replay.offline import check
from tests.conftest import wait_for_events
from tests.grpc.test_images import IMAGE_TOKEN, TALL, WIDE, Pool, body, reference_processor, runs, spawn_pool
from tests.grpc.test_pd import sse_events


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    yield from spawn_pool("tokenspeed", tmp_path_factory.mktemp("images-tokenspeed") / "journal.db")


def test_each_image_reaches_the_engine_as_an_item_with_its_pixels(pool: Pool) -> None:
    pool.control.reset()
    pool.control.script({"text": "Two pictures."})
    reply = httpx.post(pool.gateway.url + "/v1/messages", json=body(), timeout=30.0)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == [{"type": "text", "text": "Two pictures."}]
    (received,) = pool.control.received()
    ids = [int(t) for t in received["tokenized"]["input_ids"]]
    items = received["mm_inputs"]["items"]
    processor = reference_processor()
    placeholders = []
    for item, data in zip(items, (WIDE, TALL), strict=True):
        reference = processor(images=[Image.open(io.BytesIO(data))], return_tensors="np")
        assert item["modality"] == "IMAGE" and item["placeholder_token_id"] == IMAGE_TOKEN
        assert b64decode(item["content_hash"]) == hashlib.sha256(data).digest()
        pixels = item["encoder_input"]
        values = np.frombuffer(b64decode(pixels["inline"]), dtype="<f4").reshape([int(d) for d in pixels["shape"]])
        assert values.shape == reference["pixel_values"].shape
        assert np.allclose(values, reference["pixel_values"], atol=1e-5)
        grid = item["model_specific_tensors"]["image_grid_thw"]
        assert np.frombuffer(b64decode(grid["inline"]), dtype="<i8").tolist() == reference["image_grid_thw"][0].tolist()
        ((placeholder),) = item["placeholders"]
        placeholders.append((int(placeholder.get("offset", 0)), int(placeholder["length"])))
        assert placeholders[-1][1] == int(reference["image_grid_thw"][0].prod()) // 4
    assert runs(ids) == placeholders
    assert reply.json()["usage"]["input_tokens"] == len(ids)
    report = check(wait_for_events(pool.journal, reply.headers["x-request-id"]))
    assert report.identical and not report.partial, report.differences


def test_a_streamed_image_request_completes(pool: Pool) -> None:
    pool.control.reset()
    pool.control.script({"text": "Streamed."})
    reply = httpx.post(pool.gateway.url + "/v1/messages", json=body(stream=True), timeout=30.0)
    assert reply.status_code == 200, reply.text
    kinds = [kind for kind, _ in sse_events(reply.text)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    (received,) = pool.control.received()
    assert len(received["mm_inputs"]["items"]) == 2
