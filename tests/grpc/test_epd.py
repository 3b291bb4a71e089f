"""EPD over loopback: scripted TokenSpeed engines as encode, prefill and decode workers in front of
a Qwen2-VL-typed fixture model; images sent as base64 and as URLs (served by a local HTTP server),
what each worker received read back, JSON and SSE, encode failing, and the journal's parts."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from journal.events import Error, Routed, Upstream
from replay.offline import check
from tests.conftest import wait_for_events
from tests.grpc.conftest import FIXTURES, target_of
from tests.grpc.test_pd import Deployment, sse_events
from tools.engine_control import EngineControl
from tools.origin import SECRET_BODY, SECRET_REASON, Origin
from tools.spawn import Spawned, spawn_engine, spawn_gateway

QWEN2VL = FIXTURES / "qwen2vl"
MODEL = "epd-fixture"
IMAGE_TOKEN = 4006  # <|image_pad|> in the fixture tokenizer, config.json's image_token_id


def png(height: int, width: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


WIDE = png(70, 100)  # 4×8 patches: 8 tokens after the 2×2 merge
SQUARE = png(56, 56, seed=1)  # 4×4 patches: 4 tokens


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    """A loopback origin the gateway may fetch from (`--fetch-allow 127.0.0.1/32`)."""
    with Origin("127.0.0.1") as served:
        served.serve("square.png", SQUARE, "image/png")
        yield served


@pytest.fixture(scope="module")
def images(origin: Origin) -> str:
    """The origin's files: `/square.png` is SQUARE, anything else 404."""
    return f"{origin.url}/file"


@pytest.fixture
def elsewhere() -> Iterator[Origin]:
    """An origin on 127.0.0.2: loopback too, and not opened by the gateway's `--fetch-allow`."""
    with Origin("127.0.0.2") as served:
        yield served


@pytest.fixture(scope="module")
def epd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    legs: dict[str, Spawned] = {}
    controls: dict[str, EngineControl] = {}
    gateway: Spawned | None = None
    try:
        for role in ("encode", "prefill", "decode"):
            extra = ["--served-model-name", MODEL, "--role", role, "--max-context-length", "4096"]
            legs[role] = spawn_engine("tokenspeed", model_path=QWEN2VL, extra=extra)
            controls[role] = EngineControl(target_of(legs[role].url))
        journal = tmp_path_factory.mktemp("epd") / "epd.db"
        gateway = spawn_gateway(
            [],
            journal=journal,
            extra=[
                "--epd-disaggregation",
                "--encode",
                legs["encode"].url,
                "9300",
                "--prefill",
                legs["prefill"].url,
                "9123",
                "--decode",
                legs["decode"].url,
                "--model-path",
                str(QWEN2VL),
                "--disable-retries",
                "--fetch-allow",
                "127.0.0.1/32",
                "--media-fetch-timeout-secs",
                "2",
            ],
        )
        yield Deployment(gateway, journal, legs, controls)
    finally:
        if gateway is not None:
            gateway.stop()
        for control in controls.values():
            control.close()
        for leg in legs.values():
            leg.stop()


@pytest.fixture
def fresh(epd: Deployment) -> Deployment:
    for control in epd.controls.values():
        control.reset()
    return epd


def b64_image(data: bytes) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()},
    }


def body(*blocks: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    content = [*blocks, {"type": "text", "text": "What is in the pictures?"}]
    return {"model": MODEL, "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": content}]}


def b64decode(value: str) -> bytes:
    return base64.b64decode(value)


def test_images_are_encoded_then_prefill_gets_their_rooms_and_decode_answers(fresh: Deployment, images: str) -> None:
    fresh.controls["decode"].script({"text": "Two pictures."})
    url_image = {"type": "image", "source": {"type": "url", "url": images + "/square.png"}}
    reply = fresh.post(body(b64_image(WIDE), url_image))
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["content"] == [{"type": "text", "text": "Two pictures."}]

    encoded = fresh.controls["encode"].encoded()
    (prefill,), (decode,) = fresh.controls["prefill"].received(), fresh.controls["decode"].received()
    # One Encode per image, each with its pixels, its grid and one room; ids tie them to the legs'.
    assert [e["request_id"] for e in encoded] == [f"{prefill['request_id']}-encode-{i}" for i in range(2)]
    grids, hashes = [], []
    for sent in encoded:
        (item,) = sent["mm_inputs"]["items"]
        assert item["modality"] == "IMAGE" and item["placeholder_token_id"] == IMAGE_TOKEN
        tensor = item["encoder_input"]
        assert tensor["dtype"] == "float32"
        rows, features = tensor["shape"]
        assert features == 3 * 2 * 14 * 14 and len(b64decode(tensor["inline"])) == rows * features * 4
        grid = item["model_specific_tensors"]["image_grid_thw"]
        grids.append(list(np.frombuffer(b64decode(grid["inline"]), dtype="<i8")))
        hashes.append(b64decode(item["content_hash"]))
        assert rows == int(np.prod(grids[-1]))
    assert grids == [[1, 4, 8], [1, 4, 4]]
    assert hashes == [hashlib.sha256(WIDE).digest(), hashlib.sha256(SQUARE).digest()]  # the URL's bytes, fetched
    rooms = [int(e["items"][0]["bootstrap_room"]) for e in encoded]
    assert len(set(rooms)) == 2 and all(0 <= r < 2**63 for r in rooms)

    # Prefill is told where each embedding comes from; neither leg carries pixels.
    info = prefill["encode_bootstrap_info"]["items"]
    assert [
        (b.get("item_index", 0), b["bootstrap_host"], b["bootstrap_port"], int(b["bootstrap_room"])) for b in info
    ] == [
        (0, "127.0.0.1", 9300, rooms[0]),
        (1, "127.0.0.1", 9300, rooms[1]),
    ]
    assert "encode_bootstrap_info" not in decode
    for leg in (prefill, decode):
        items = leg["mm_inputs"]["items"]
        assert [("encoder_input" in i, i["placeholders"]) for i in items] == [
            (False, [{"offset": items[0]["placeholders"][0]["offset"], "length": 8}]),
            (False, [{"offset": items[1]["placeholders"][0]["offset"], "length": 4}]),
        ]
        ids = leg["tokenized"]["input_ids"]
        for item in items:
            start, length = item["placeholders"][0]["offset"], item["placeholders"][0]["length"]
            assert ids[start : start + length] == [IMAGE_TOKEN] * length
        assert ids.count(IMAGE_TOKEN) == 12  # each placeholder expanded
    assert prefill["kv_bootstrap_info"] == decode["kv_bootstrap_info"]
    assert message["usage"]["input_tokens"] == len(decode["tokenized"]["input_ids"])

    events = wait_for_events(fresh.journal, reply.headers["x-request-id"])
    routed = [e.worker for e in events if isinstance(e, Routed)]
    assert routed == [fresh.url("encode"), fresh.url("encode"), fresh.url("prefill"), fresh.url("decode")]
    assert {e.backend for e in events if isinstance(e, Routed)} == {"grpc-epd"}  # the pool's one name
    parts = [(e.part, e.worker, e.status) for e in events if isinstance(e, Upstream)]
    assert parts == [
        ("prefill:encode", fresh.url("encode"), 200),
        ("prefill:encode", fresh.url("encode"), 200),
        ("prefill:complete", fresh.url("prefill"), 200),
    ]
    first = json.loads(next(e for e in events if isinstance(e, Upstream)).data or "{}")
    assert first["bootstrap"]["room"] == rooms[0] and first["content_hash"] == hashlib.sha256(WIDE).hexdigest()
    # Offline replay reads the decode leg's tokens as any gRPC record's.
    report = check(events)
    assert report.identical and not report.partial, report.differences


def test_images_stream_through_the_pair(fresh: Deployment) -> None:
    fresh.controls["decode"].script({"text": "Streamed picture."})
    with httpx.stream("POST", fresh.gateway.url + "/v1/messages", json=body(b64_image(SQUARE), stream=True)) as r:
        assert r.status_code == 200
        text = r.read().decode()
    deltas = [d["delta"].get("text", "") for name, d in sse_events(text) if name == "content_block_delta"]
    assert "".join(deltas) == "Streamed picture."
    assert len(fresh.controls["encode"].encoded()) == 1
    (prefill,) = fresh.controls["prefill"].received()
    assert len(prefill["encode_bootstrap_info"]["items"]) == 1


@pytest.mark.parametrize(
    ("failure", "status"),
    [
        ({"code": "INVALID_ARGUMENT", "message": "bad pixels"}, 400),
        ({"accepted": False}, 400),
        ({"code": "INTERNAL", "message": "tower crashed"}, 500),
    ],
)
def test_an_encode_failure_ends_the_request_before_prefill(
    fresh: Deployment, failure: dict[str, Any], status: int
) -> None:
    if failure.get("accepted") is False:
        fresh.controls["encode"].fail_encode(accepted=False)
    else:
        fresh.controls["encode"].fail_encode(failure["code"], failure["message"])
    reply = fresh.post(body(b64_image(SQUARE)))
    assert reply.status_code == status, reply.text
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert reply.json()["error"]["message"].startswith("Encode error: ")
    assert fresh.controls["prefill"].received() == [] and fresh.controls["decode"].received() == []
    events = wait_for_events(fresh.journal, reply.headers["x-request-id"])
    (record,) = [e for e in events if isinstance(e, Upstream)]
    assert record.part == "prefill:encode" and record.status == status
    assert json.loads(record.data or "{}")["accepted"] is False
    (error,) = [e for e in events if isinstance(e, Error)]
    assert error.stage == "encode"


def test_an_encode_failure_streaming_is_an_error_event(fresh: Deployment) -> None:
    fresh.controls["encode"].fail_encode("INVALID_ARGUMENT", "bad pixels")
    reply = fresh.post(body(b64_image(SQUARE), stream=True))
    assert reply.status_code == 400
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert fresh.controls["prefill"].received() == []


def test_media_failures_are_refused_before_any_worker(fresh: Deployment, images: str) -> None:
    missing = {"type": "image", "source": {"type": "url", "url": images + "/missing.png"}}
    reply = fresh.post(body(missing))
    assert reply.status_code == 400 and reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert reply.json()["error"]["message"] == (
        "image URL could not be fetched: the destination did not answer with the content (status other than 200)"
    )
    garbage = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}}
    reply = fresh.post(body(garbage))
    assert reply.status_code == 400 and reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert reply.json()["error"]["message"] == "Failed to decode image: not a recognised image format"
    assert all(c.received() == [] and c.encoded() == [] for c in fresh.controls.values())


def url_image(url: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "url", "url": url}}


def refusal(reply: httpx.Response) -> str:
    """The refusal's message, checked to repeat nothing a destination said and no address of an object."""
    assert reply.status_code == 400, reply.text
    message: str = reply.json()["error"]["message"]
    assert SECRET_REASON not in reply.text and SECRET_BODY.decode() not in reply.text
    assert not re.search(r"0x[0-9a-f]{6,}", reply.text) and "object at" not in reply.text
    return message


@pytest.mark.parametrize(
    "host", ["127.0.0.2", "2130706434", "0x7f.2", "127.2", "0177.0.0.2", "[::ffff:127.0.0.2]"]
)
def test_an_image_url_to_a_refused_destination_is_never_dialled(
    fresh: Deployment, elsewhere: Origin, host: str
) -> None:
    reply = fresh.post(body(url_image(f"http://{host}:{elsewhere.port}/file/a.png")))
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert refusal(reply).startswith("image URL refused: destination ")
    assert "is a loopback address" in refusal(reply) and "--fetch-allow" in refusal(reply)
    assert elsewhere.connections == 0
    assert all(c.received() == [] and c.encoded() == [] for c in fresh.controls.values())


def test_a_redirect_to_a_refused_destination_is_refused_at_its_hop(
    fresh: Deployment, origin: Origin, elsewhere: Origin
) -> None:
    before = origin.requests
    target = elsewhere.serve("a.png", SQUARE, "image/png")
    reply = fresh.post(body(url_image(f"{origin.url}/redirect?to={target}")))
    assert refusal(reply) == (
        "image URL refused: destination 127.0.0.2 is a loopback address; allow it with --fetch-allow"
    )
    assert origin.requests == before + 1 and elsewhere.connections == 0


def test_an_image_url_with_credentials_is_refused(fresh: Deployment, origin: Origin, images: str) -> None:
    before = origin.connections, origin.requests
    reply = fresh.post(body(url_image(images.replace("http://", "http://user:pw@") + "/square.png")))
    assert reply.headers["x-smg-error-code"] == "invalid_multimodal_request"
    assert refusal(reply) == "image URL refused: URLs with credentials (user:password@) are not fetched"
    assert (origin.connections, origin.requests) == before


def test_more_images_than_allowed_are_one_refusal_and_no_fetch(
    fresh: Deployment, origin: Origin, images: str
) -> None:
    before = origin.connections, origin.requests
    reply = fresh.post(body(*[url_image(f"{images}/square.png?{i}") for i in range(500)]))
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert refusal(reply) == "The request has 500 images; at most 100 are accepted"
    assert (origin.connections, origin.requests) == before  # a kept-alive connection would carry requests
    assert all(c.received() == [] and c.encoded() == [] for c in fresh.controls.values())


def test_a_trickled_image_ends_at_the_requests_fetch_deadline(fresh: Deployment, origin: Origin) -> None:
    reply = fresh.post(body(url_image(f"{origin.url}/trickle")))
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert refusal(reply) == "image URL fetch timed out after 2 s for the request"
    assert all(c.received() == [] and c.encoded() == [] for c in fresh.controls.values())


def test_the_requests_images_share_one_fetch_budget(fresh: Deployment, origin: Origin) -> None:
    # 16 MiB each: every one is under the 20 MiB cap of one image, two are over the request's 32 MiB.
    blocks = [url_image(f"{origin.url}/bytes/{16 * 1024 * 1024}?chunked=1&n={i}") for i in range(3)]
    reply = fresh.post(body(*blocks))
    assert reply.headers["x-smg-error-code"] == "multimodal_processing_failed"
    assert re.fullmatch(r"image \d fetch exceeded the request's 32 MiB media budget", refusal(reply))
    assert all(c.received() == [] and c.encoded() == [] for c in fresh.controls.values())


def test_an_error_status_is_refused_without_repeating_the_answer(fresh: Deployment, origin: Origin) -> None:
    reply = fresh.post(body(url_image(f"{origin.url}/status/403")))
    assert "403" not in refusal(reply)


def test_count_tokens_counts_the_placeholder_and_fetches_nothing(fresh: Deployment, images: str) -> None:
    url_image = {"type": "image", "source": {"type": "url", "url": images + "/missing.png"}}
    counted = fresh.post(
        {"model": MODEL, "messages": [{"role": "user", "content": [url_image, {"type": "text", "text": "?"}]}]},
        "/v1/messages/count_tokens",
    )
    assert counted.status_code == 200, counted.text  # the unreachable URL was never fetched
    assert all(c.received() == [] and c.encoded() == [] for c in fresh.controls.values())


def test_a_regular_grpc_pool_still_refuses_images(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/messages",
        json={
            "model": "qwen3-fixture",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [b64_image(SQUARE)]}],
        },
    )
    assert reply.status_code == 400
    assert reply.headers["x-smg-error-code"] == "multimodal_not_supported"


def test_each_image_gets_an_encode_worker_by_the_encode_policy(tmp_path: Path) -> None:
    legs: dict[str, Spawned] = {}
    gateway: Spawned | None = None
    try:
        roles = (("encode", "encode-a"), ("encode", "encode-b"), ("prefill", "prefill"), ("decode", "decode"))
        for role, name in roles:
            extra = ["--served-model-name", MODEL, "--role", role]
            legs[name] = spawn_engine("tokenspeed", model_path=QWEN2VL, extra=extra)
        gateway = spawn_gateway(
            [],
            journal=tmp_path / "encoders.db",
            extra=["--epd-disaggregation", "--encode", legs["encode-a"].url, "9301", "--encode", legs["encode-b"].url,
                   "9302", "--prefill", legs["prefill"].url, "--decode", legs["decode"].url, "--model-path",
                   str(QWEN2VL), "--encode-policy", "round_robin", "--disable-retries"],
        )
        reply = httpx.post(gateway.url + "/v1/messages", json=body(b64_image(WIDE), b64_image(SQUARE)), timeout=30)
        assert reply.status_code == 200, reply.text
        controls = {name: EngineControl(target_of(legs[name].url)) for name in ("encode-a", "encode-b", "prefill")}
        try:
            sent_a, sent_b = controls["encode-a"].encoded(), controls["encode-b"].encoded()
            assert len(sent_a) == len(sent_b) == 1  # round robin: one image each
            (prefill,) = controls["prefill"].received()
        finally:
            for control in controls.values():
                control.close()
        ports = {int(b["bootstrap_port"]): int(b["bootstrap_room"]) for b in prefill["encode_bootstrap_info"]["items"]}
        assert ports == {
            9301: int(sent_a[0]["items"][0]["bootstrap_room"]),
            9302: int(sent_b[0]["items"][0]["bootstrap_room"]),
        }
    finally:
        if gateway is not None:
            gateway.stop()
        for leg in legs.values():
            leg.stop()
