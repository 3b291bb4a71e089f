"""Images through the gateway into a real vLLM engine serving a tiny random Qwen2-VL, over gRPC
(smg-grpc-servicer's `MultimodalInputs`) and over ZMQ (EngineCore's `mm_features`, no servicer).

Opt-in (``make test-vllm``): ``SMG_VLLM_PYTHON`` names a vLLM CPU venv's python (with the
torchvision shim the Makefile installs) and ``SMG_VLLM_VISION_MODEL`` the model
(``tools/build_tiny_model.py --vision``); without them every test is skipped. One engine runs at
a time (the deployment fixture is parametrized per transport). vLLM scatters each image's
encoder output over its placeholder range and fails the request, or over ZMQ dies, when the
range and the embeddings disagree, so an answer at all says the expansion is right; over gRPC
the engine also reports the prompt's length, which the usage carries. The wire itself is
checked first, without an engine: the gateway's ADD frames decoded by vLLM's own
`MsgpackDecoder(EngineCoreRequest)` and batched by vLLM's own field classes.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from replay.offline import check
from smg.backends.zmq import features, wire
from smg.pipeline.media import MediaItem
from smg.pipeline.vision import expand
from smg.pipeline.vision.qwen_vl import QwenVlProcessor
from tests.conftest import wait_for_events
from tests.grpc.test_images import IMAGE_TOKEN, TALL, WIDE, image_block, runs
from tests.grpc.test_pd import sse_events
from tests.interop.test_vllm import start_vllm
from tests.interop.test_vllm_zmq import start_headless_vllm
from tools.spawn import Spawned, spawn_gateway

PYTHON_ENV = "SMG_VLLM_PYTHON"
MODEL_ENV = "SMG_VLLM_VISION_MODEL"
MODEL = "tiny-qwen2vl"
BF16_RTOL = 2.0**-8
# A vision model's engine profiles its encoder too: minutes, not seconds, when the cores are shared.
ENGINE_START_TIMEOUT = 480.0

pytestmark = pytest.mark.skipif(
    not (os.environ.get(PYTHON_ENV) and os.environ.get(MODEL_ENV)),
    reason=f"real-engine interop test, opt-in: run `make test-vllm` (it sets {PYTHON_ENV} and {MODEL_ENV})",
)

# Run in the vLLM venv: decode an ADD's frames as EngineCore does and describe what came out.
DECODE = """
import json, sys
from pathlib import Path
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.serial_utils import MsgpackDecoder
frames = [p.read_bytes() for p in sorted(Path(sys.argv[1]).iterdir())]
request = MsgpackDecoder(EngineCoreRequest).decode(frames)
out = {"request_id": request.request_id, "prompt": request.prompt_token_ids, "features": [], "batched": {}}
for f in request.mm_features:
    out["features"].append({
        "modality": f.modality, "identifier": f.identifier, "mm_hash": f.mm_hash,
        "offset": f.mm_position.offset, "length": f.mm_position.length, "is_embed": f.mm_position.is_embed,
        "data": {k: {"dtype": str(e.data.dtype), "shape": list(e.data.shape), "field": type(e.field).__name__,
                     "keep_on_cpu": e.field.keep_on_cpu} for k, e in f.data.items()},
    })
for key in request.mm_features[0].data:
    elems = [f.data[key] for f in request.mm_features]
    joined = elems[0].field.reduce_data(elems)
    out["batched"][key] = {"shape": list(joined.shape), "values": joined.float().flatten().tolist()}
# The gateway's float32 pixels rounded by torch itself: the bfloat16 the engine got must be these bits.
import numpy, torch
f32 = torch.from_numpy(numpy.fromfile(sys.argv[2], dtype="<f4").copy())
joined = torch.cat([f.data["pixel_values"].data.flatten() for f in request.mm_features])
out["bf16_as_torch_rounds"] = bool(torch.equal(joined.view(torch.int16), f32.to(torch.bfloat16).view(torch.int16)))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(os.environ[MODEL_ENV]).resolve()


def reference(model_dir: Path) -> tuple[Any, list[int]]:
    """`transformers`' own processor on the two images: its pixels and each image's patch count."""
    from transformers import Qwen2VLImageProcessorPil

    pre = json.loads((model_dir / "preprocessor_config.json").read_text())
    processor = Qwen2VLImageProcessorPil(min_pixels=pre["min_pixels"], max_pixels=pre["max_pixels"])
    from PIL import Image

    out = processor(images=[Image.open(io.BytesIO(WIDE)), Image.open(io.BytesIO(TALL))], return_tensors="np")
    return out["pixel_values"], [int(g.prod()) for g in out["image_grid_thw"]]


def test_vllms_own_decoder_reads_the_gateways_frames(model_dir: Path, tmp_path: Path) -> None:
    processor = QwenVlProcessor.from_model_dir(model_dir)
    images = [MediaItem(data=d, media_type="image/png") for d in (WIDE, TALL)]
    ids, items = expand([1, IMAGE_TOKEN, 5, IMAGE_TOKEN, 7], processor, images)
    mm, aux = features.mm_features(ids, items, "torch.bfloat16")
    payload = wire.add_request("req-1", ids, {"max_tokens": 4}, mm)
    frames = tmp_path / "frames"
    frames.mkdir()
    for i, frame in enumerate([payload, *aux]):
        (frames / f"{i:03d}").write_bytes(frame)
    (tmp_path / "pixels.f32").write_bytes(b"".join(item.pixel_values.data for item in items))
    command = [os.environ[PYTHON_ENV], "-c", DECODE, str(frames), str(tmp_path / "pixels.f32")]
    done = subprocess.run(command, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    decoded = json.loads(done.stdout.decode().strip().splitlines()[-1])
    pixels, patches = reference(model_dir)
    assert decoded["request_id"] == "req-1" and decoded["prompt"] == ids
    assert [(f["offset"], f["length"]) for f in decoded["features"]] == runs(ids)
    assert [f["length"] for f in decoded["features"]] == [p // 4 for p in patches]
    for feature, count in zip(decoded["features"], patches, strict=True):
        assert feature["modality"] == "image" and feature["is_embed"] is None
        assert feature["data"] == {
            "pixel_values": {"dtype": "torch.bfloat16", "shape": [count, 1176], "field": "MultiModalFlatField",
                             "keep_on_cpu": False},
            "image_grid_thw": {"dtype": "torch.int64", "shape": [3], "field": "MultiModalBatchedField",
                               "keep_on_cpu": True},
        }
    batched = decoded["batched"]
    assert batched["image_grid_thw"]["shape"] == [2, 3]
    assert batched["pixel_values"]["shape"] == [sum(patches), 1176]
    joined = np.asarray(batched["pixel_values"]["values"]).reshape(sum(patches), 1176)
    assert np.allclose(joined, pixels, rtol=BF16_RTOL, atol=1e-6)
    assert decoded["bf16_as_torch_rounds"]


@dataclass
class Deployment:
    transport: str
    gateway: Spawned
    journal: Path


@pytest.fixture(scope="module", params=["grpc", "zmq"])
def deployment(
    request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    transport = str(request.param)
    python = os.environ[PYTHON_ENV]
    scratch = Path(tempfile.mkdtemp(prefix=f"smg-vllm-vl-{transport}-"))
    journal = tmp_path_factory.mktemp(f"vl-{transport}") / "journal.db"
    engine: Spawned | None = None
    gateway: Spawned | None = None
    try:
        if transport == "grpc":
            engine = start_vllm(python, model_dir, scratch, served_name=MODEL, timeout=ENGINE_START_TIMEOUT)
            extra = ["--model-path", str(model_dir), "--disable-retries"]
            gateway = spawn_gateway([engine.url], journal=journal, extra=extra, timeout=60.0)
        else:  # the gateway binds first, then the engine dials its handshake port
            url = f"ipc://{scratch}/zmq/w0"
            extra = ["--backend", "vllm", "--model-path", str(model_dir), "--model-alias", f"{MODEL}={model_dir}",
                     "--disable-retries"]
            gateway = spawn_gateway([url], journal=journal, extra=extra, timeout=60.0)
            engine = start_headless_vllm(python, model_dir, url, scratch)
        deadline = time.monotonic() + ENGINE_START_TIMEOUT
        while httpx.get(f"{gateway.url}/readiness", timeout=5.0).status_code != 200:
            if engine.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {engine.proc.returncode}:\n{engine.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker never became ready:\n{gateway.log()[-3000:]}")
            time.sleep(0.5)
        yield Deployment(transport, gateway, journal)
        assert engine.proc.poll() is None, f"the engine died:\n{engine.log()[-4000:]}"
    finally:
        if gateway is not None:
            gateway.stop()
        if engine is not None:
            engine.stop(timeout=15.0)
        shutil.rmtree(scratch, ignore_errors=True)


def body(stream: bool = False) -> dict[str, Any]:
    content = [image_block(WIDE), {"type": "text", "text": "and"}, image_block(TALL)]
    return {"model": MODEL, "max_tokens": 16, "stream": stream, "temperature": 1.0,
            "messages": [{"role": "user", "content": content}]}


def expected_prompt(deployment: Deployment, model_dir: Path) -> int:
    """count_tokens (each image its one placeholder, nothing fetched) plus each image's expansion."""
    counted = httpx.post(f"{deployment.gateway.url}/v1/messages/count_tokens", json=body(), timeout=30.0)
    assert counted.status_code == 200, counted.text
    _, patches = reference(model_dir)
    return int(counted.json()["input_tokens"]) + sum(p // 4 - 1 for p in patches)


def test_an_image_request_is_answered(deployment: Deployment, model_dir: Path) -> None:
    reply = httpx.post(f"{deployment.gateway.url}/v1/messages", json=body(), timeout=120.0)
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["stop_reason"] in ("max_tokens", "end_turn")
    assert 0 < message["usage"]["output_tokens"] <= 16
    assert message["usage"]["input_tokens"] == expected_prompt(deployment, model_dir)
    events = wait_for_events(deployment.journal, reply.headers["x-request-id"])
    report = check(events)
    assert report.identical and not report.partial, report.differences


def test_a_streamed_image_request_completes(deployment: Deployment, model_dir: Path) -> None:
    with httpx.stream("POST", f"{deployment.gateway.url}/v1/messages", json=body(stream=True), timeout=120.0) as reply:
        assert reply.status_code == 200
        events = sse_events(reply.read().decode())
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    usage = events[-2][1]["usage"]
    assert 0 < usage["output_tokens"] <= 16
    assert usage["input_tokens"] == expected_prompt(deployment, model_dir)
    events_journaled = wait_for_events(deployment.journal, reply.headers["x-request-id"])
    report = check(events_journaled)
    assert report.identical and not report.partial, report.differences


def test_the_same_image_twice_is_answered(deployment: Deployment) -> None:
    # The second request's features carry the same identifiers: vLLM may serve them from its caches.
    data = base64.b64encode(TALL).decode()
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    payload = {**body(), "messages": [{"role": "user", "content": [block, {"type": "text", "text": "again"}]}]}
    for _ in range(2):
        reply = httpx.post(f"{deployment.gateway.url}/v1/messages", json=payload, timeout=120.0)
        assert reply.status_code == 200, reply.text
