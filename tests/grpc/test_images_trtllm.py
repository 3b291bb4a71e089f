"""Images on a TRT-LLM gRPC pool: each image's own bytes in `multimodal_input.image_data` (TRT-LLM's
input processor encodes them), the prompt's placeholders expanded by the gateway as for SGLang
and vLLM, under the same media refusals and fetch policy; an MLX pool still refuses images."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from replay.offline import check
from tests.conftest import wait_for_events
from tests.grpc.test_images import TALL, WIDE, Pool, body, image_block, reference_processor, runs, spawn_pool
from tests.grpc.test_pd import sse_events
from tools.origin import Origin

MEDIA_FLAGS = ("--fetch-allow", "127.0.0.1/32", "--media-fetch-timeout-secs", "5")


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    """A loopback origin the gateway may fetch from (`--fetch-allow 127.0.0.1/32`)."""
    with Origin("127.0.0.1") as served:
        served.serve("tall.png", TALL, "image/png")
        yield served


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[Origin]:
    """Loopback too, and not opened by the gateway's `--fetch-allow`."""
    with Origin("127.0.0.2") as served:
        served.serve("tall.png", TALL, "image/png")
        yield served


@pytest.fixture(scope="module")
def trtllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    yield from spawn_pool("trtllm", tmp_path_factory.mktemp("images-trtllm") / "journal.db", MEDIA_FLAGS)


@pytest.fixture(scope="module")
def mlx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    yield from spawn_pool("mlx", tmp_path_factory.mktemp("images-mlx") / "journal.db", MEDIA_FLAGS)


def url_block(url: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "url", "url": url}}


def with_content(*content: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    return {**body(stream), "messages": [{"role": "user", "content": [*content, {"type": "text", "text": "?"}]}]}


def image_data(received: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(item) for item in received["multimodal_input"]["image_data"]]


def test_the_images_own_bytes_reach_trtllm_with_the_expanded_placeholders(trtllm: Pool) -> None:
    trtllm.control.reset()
    trtllm.control.script({"text": "Two pictures."})
    reply = httpx.post(trtllm.gateway.url + "/v1/messages", json=body(), timeout=30.0)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == [{"type": "text", "text": "Two pictures."}]
    (received,) = trtllm.control.received()
    assert image_data(received) == [WIDE, TALL]
    ids = [int(t) for t in received["tokenized"]["input_token_ids"]]
    reference = reference_processor()(
        images=[Image.open(io.BytesIO(WIDE)), Image.open(io.BytesIO(TALL))], return_tensors="np"
    )
    assert [n for _, n in runs(ids)] == [int(g.prod()) // 4 for g in reference["image_grid_thw"]]
    # The rendered text keeps the template's one placeholder per image.
    assert received["tokenized"]["original_text"].count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert reply.json()["usage"]["input_tokens"] == len(ids)
    assert "mm_inputs" not in received
    report = check(wait_for_events(trtllm.journal, reply.headers["x-request-id"]))
    assert report.identical and not report.partial, report.differences


def test_a_streamed_request_with_a_fetched_image_completes(trtllm: Pool, origin: Origin) -> None:
    trtllm.control.reset()
    trtllm.control.script({"text": "Fetched."})
    content = with_content(image_block(WIDE), url_block(f"{origin.url}/file/tall.png"), stream=True)
    with httpx.stream("POST", trtllm.gateway.url + "/v1/messages", json=content, timeout=30.0) as reply:
        assert reply.status_code == 200
        events = sse_events(reply.read().decode())
    assert events[-1][0] == "message_stop"
    assert "".join(e[1]["delta"].get("text", "") for e in events if e[0] == "content_block_delta") == "Fetched."
    (received,) = trtllm.control.received()
    assert image_data(received) == [WIDE, TALL]


def test_the_media_refusals_hold_before_the_engine(trtllm: Pool, elsewhere: Origin) -> None:
    trtllm.control.reset()
    undecodable = httpx.post(
        trtllm.gateway.url + "/v1/messages", json=with_content(image_block(b"not an image")), timeout=30.0
    )
    assert undecodable.status_code == 400
    assert undecodable.headers["x-smg-error-code"] == "multimodal_processing_failed"
    # A destination the fetch policy does not open is refused before any connection is made.
    refused = httpx.post(
        trtllm.gateway.url + "/v1/messages",
        json=with_content(url_block(f"{elsewhere.url}/file/tall.png")),
        timeout=30.0,
    )
    assert refused.status_code == 400, refused.text
    assert refused.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert refused.json()["error"]["message"] == (
        "image URL refused: destination 127.0.0.2 is a loopback address; allow it with --fetch-allow"
    )
    assert elsewhere.connections == 0
    assert trtllm.control.received() == []
    events = wait_for_events(trtllm.journal, refused.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]


def test_count_tokens_fetches_nothing_and_counts_the_placeholder(trtllm: Pool, elsewhere: Origin) -> None:
    trtllm.control.reset()
    counted = httpx.post(
        trtllm.gateway.url + "/v1/messages/count_tokens",
        json=with_content(url_block(f"{elsewhere.url}/file/tall.png")),
        timeout=30.0,
    )
    assert counted.status_code == 200, counted.text
    assert elsewhere.connections == 0 and trtllm.control.received() == []


def test_an_mlx_pool_still_refuses_images(mlx: Pool) -> None:
    mlx.control.reset()
    reply = httpx.post(mlx.gateway.url + "/v1/messages", json=with_content(image_block(TALL)), timeout=30.0)
    assert reply.status_code == 400, reply.text
    assert reply.headers["x-smg-error-code"] == "multimodal_not_supported"
    assert reply.json()["error"]["message"] == "backend mlx does not support image inputs"
    assert mlx.control.received() == []
    events = wait_for_events(mlx.journal, reply.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]
