"""Images on a vLLM ZMQ pool: preprocessed by the gateway (the Qwen2-VL-typed fixture model) and
sent as the EngineCoreRequest's `mm_features`, their tensors in frames after the payload; checked
against what the scripted EngineCore decoded over loopback and against `transformers`' own
processor on the same images. A TokenSpeed pool, whose requests carry no images, refuses them."""

from __future__ import annotations

import hashlib
import io
import shutil
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
from tests.grpc.test_images import IMAGE_TOKEN, TALL, WIDE, body, image_block, runs
from tests.grpc.test_pd import sse_events
from tests.zmq.conftest import FIXTURES, socket_dir, target_of, wait_ready
from tools.engine_control import EngineControl
from tools.spawn import spawn_gateway, spawn_zmq_engine

QWEN2VL = FIXTURES / "qwen2vl"
BF16_RTOL = 2.0**-8  # the scripted engine says its dtype is bfloat16: pixels are sent rounded to it


def deploy(
    directory: Path, journal: Path, runtime: str, env: dict[str, str] | None = None, model: Path = QWEN2VL
) -> Iterator[tuple[httpx.Client, EngineControl, Path]]:
    path = directory / "w0"
    gateway = spawn_gateway(
        [f"ipc://{path}"], journal=journal, env=env,
        extra=["--backend", runtime, "--model-path", str(model), "--model-alias", f"vl-fixture={model}"],
    )
    engine = None
    try:
        engine = spawn_zmq_engine(path, model, ["--runtime", runtime])
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


# --- The other families the gateway preprocesses: each in its vLLM field layout ----------------------
# Each model directory is the Qwen2-VL fixture's tokenizer and chat template with the family's image
# tokens added and its config and preprocessor settings (small images, so small tensors).

FAMILY_TOKENS = [
    "[IMG]", "[IMG_BREAK]", "[IMG_END]", "\n\n", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
    "<|image|>", "<|image>", "<image|>", "<|image_start|>", "<|image_end|>", "<|patch|>",
    "<|tile_x_separator|>", "<|tile_y_separator|>",
]
FAMILY_IDS = {token: 4014 + i for i, token in enumerate(FAMILY_TOKENS)}


@dataclass(frozen=True)
class Family:
    placeholder: str  # what the chat template renders for an image
    config: dict[str, Any]
    preprocessor: dict[str, Any]
    # vLLM's field config: its name for each tensor sent -> (field, keep_on_cpu); the pixels first.
    fields: dict[str, tuple[str, bool]]
    pixel_rank: int  # dimensions of one image's pixels as sent


T = FAMILY_IDS
FAMILIES = {
    "mistral3": Family(
        "[IMG]",
        {"model_type": "mistral3", "image_token_index": T["[IMG]"], "spatial_merge_size": 2,
         "vision_config": {"patch_size": 14}},
        {"image_processor_type": "PixtralImageProcessor", "patch_size": {"height": 14, "width": 14},
         "size": {"longest_edge": 112}},
        {"pixel_values": ("batched", False)},
        3,
    ),
    "gemma3": Family(
        "<start_of_image>",
        {"model_type": "gemma3", "mm_tokens_per_image": 16, "image_token_index": T["<image_soft_token>"],
         "boi_token_index": T["<start_of_image>"], "eoi_token_index": T["<end_of_image>"]},
        {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 56, "width": 56}},
        {"pixel_values": ("flat", False), "num_patches": ("batched", True)},
        4,
    ),
    "gemma4": Family(
        "<|image|>",
        {"model_type": "gemma4", "image_token_id": T["<|image|>"], "boi_token_id": T["<|image>"],
         "eoi_token_id": T["<image|>"]},
        {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 70, "patch_size": 4},
        {"pixel_values": ("batched", False), "pixel_position_ids": ("batched", False)},
        2,
    ),
    "llama4": Family(
        "<|image|>",
        {"model_type": "llama4", "image_token_index": T["<|patch|>"],
         "vision_config": {"image_size": 56, "patch_size": 14, "pixel_shuffle_ratio": 0.5}},
        {"size": {"height": 56, "width": 56}, "max_patches": 4},
        {"pixel_values": ("flat", False), "aspect_ratios": ("batched", True), "patches_per_image": ("batched", True)},
        4,
    ),
}


def family_dir(root: Path, model_type: str, family: Family | None = None) -> Path:
    """The Qwen2-VL fixture turned into a `model_type` model: config, preprocessor, image tokens."""
    import json

    root.mkdir(parents=True, exist_ok=True)
    for name in ("generation_config.json", "tokenizer_config.json"):
        shutil.copy(QWEN2VL / name, root / name)
    tokenizer = json.loads((QWEN2VL / "tokenizer.json").read_text())
    for token, token_id in FAMILY_IDS.items():
        tokenizer["added_tokens"].append({"id": token_id, "content": token, "single_word": False, "lstrip": False,
                                          "rstrip": False, "normalized": False, "special": True})
    (root / "tokenizer.json").write_text(json.dumps(tokenizer))
    template = (QWEN2VL / "chat_template.jinja").read_text()
    placeholder = family.placeholder if family else "<|image|>"
    (root / "chat_template.jinja").write_text(template.replace("<|image_pad|>", placeholder))
    base = json.loads((QWEN2VL / "config.json").read_text())
    config = {k: base[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config["vocab_size"] = 4014 + len(FAMILY_IDS)
    config.update(family.config if family else {"model_type": model_type})
    (root / "config.json").write_text(json.dumps(config))
    preprocessor = family.preprocessor if family else {"size": {"height": 56, "width": 56}, "dynamic_hd": 4}
    (root / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return root


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, httpx.Client, EngineControl, Path]]:
    name = str(request.param)
    model = family_dir(tmp_path_factory.mktemp(f"model-{name}"), name, FAMILIES[name])
    journal = tmp_path_factory.mktemp(f"zmq-{name}") / "journal.db"
    for deployed in deploy(socket_dir(), journal, "vllm", model=model):
        yield (name, model, *deployed)


def test_each_family_reaches_the_engine_in_its_vllm_layout(
    family: tuple[str, Path, httpx.Client, EngineControl, Path],
) -> None:
    from smg.pipeline.media import MediaItem
    from smg.pipeline.vision import processor_for

    name, model, client, control, journal = family
    spec = FAMILIES[name]
    control.reset()
    control.script({"text": "Two pictures."})
    reply = client.post("/v1/messages", json=body())
    assert reply.status_code == 200, reply.text
    (received,) = control.received()
    ids = [int(t) for t in received["prompt_token_ids"]]
    processor = processor_for(model)
    ours = [processor.process(MediaItem(d, "image/png")) for d in (WIDE, TALL)]
    features = received["mm_features"]
    assert len(features) == 2
    # Each image's replacement sits where its feature's range says, its embeddings where is_embed says.
    for feature, processed in zip(features, ours, strict=True):
        offset, length = feature["mm_position"]["offset"], feature["mm_position"]["length"]
        assert tuple(ids[offset : offset + length]) == processed.tokens
        embeds = [t == processed.embed_token_id for t in processed.tokens]
        assert feature["mm_position"]["is_embed"] == (None if all(embeds) else embeds)
    assert reply.json()["usage"]["input_tokens"] == len(ids)
    sizes = [p.pixel_values.shape[0] for p in ours]
    for feature, processed, size in zip(features, ours, sizes, strict=True):
        data = feature["data"]
        assert sorted(data) == sorted(spec.fields)
        for key, (kind, keep_on_cpu) in spec.fields.items():
            factory, options = data[key]["field"]
            assert factory == kind and options["keep_on_cpu"] is keep_on_cpu, key
            if kind == "flat":
                assert options["slices"] == [[0, sizes[0], None], [sizes[0], sizes[0] + sizes[1], None]]
                assert options["dim"] == 0
        pixels = data["pixel_values"]
        expected = processed.pixel_values.array()
        if spec.fields["pixel_values"][0] == "batched":
            expected = expected[0]  # the image's row
        assert pixels["dtype"] == "bfloat16" and len(pixels["shape"]) == spec.pixel_rank
        assert pixels["shape"] == list(expected.shape)
        assert np.allclose(values(pixels), expected, rtol=BF16_RTOL, atol=1e-6)
        model_tensors = {k: v.array() for k, v in processed.model_tensors.items()}
        if name == "gemma3":  # vLLM's num_patches: the image and its pan-and-scan crops (none here)
            assert data["num_patches"]["dtype"] == "int64" and values(data["num_patches"]).tolist() == 1
        if name == "gemma4":
            assert data["pixel_position_ids"]["dtype"] == "int64"
            assert values(data["pixel_position_ids"]).tolist() == model_tensors["image_position_ids"][0].tolist()
        if name == "llama4":
            assert values(data["aspect_ratios"]).tolist() == model_tensors["aspect_ratios"][0].tolist()
            assert values(data["patches_per_image"]).tolist() == size
    events = wait_for_events(journal, reply.headers["x-request-id"])
    report = check(events)
    assert report.identical and not report.partial, report.differences


@pytest.fixture(scope="module")
def phi4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, EngineControl, Path]]:
    model = family_dir(tmp_path_factory.mktemp("model-phi4mm"), "phi4mm")
    yield from deploy(socket_dir(), tmp_path_factory.mktemp("zmq-phi4") / "journal.db", "vllm", model=model)


def test_a_family_not_laid_out_keeps_its_refusal(phi4: tuple[httpx.Client, EngineControl, Path]) -> None:
    client, control, journal = phi4
    control.reset()
    reply = client.post("/v1/messages", json=body())
    assert reply.status_code == 400, reply.text
    assert reply.headers["x-smg-error-code"] == "multimodal_not_supported"
    assert reply.json()["type"] == "error"
    assert control.received() == []
    events = wait_for_events(journal, reply.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]
