"""Llama 4's and Phi-4 multimodal's image processors, value for value against `transformers`' own
processors, which run in torch only: `tools/vision_reference.py` runs `Llama4ImageProcessor` and
`Phi4MultimodalImageProcessor` (formerly `…Fast`), and the `Llama4Processor` and
`Phi4MultimodalProcessor` that expand the prompt, in the vLLM venv on the same image files and
model directories (the models' published preprocessor settings, written here); the gateway's
processors run here.

Every tensor is compared: integer ones (aspect ratios, image sizes, attention masks, token counts)
equal, pixels within the tolerance stated per family, and the expanded prompt's ids equal.

Opt-in (``make test-vllm``): ``SMG_VLLM_PYTHON`` names the vLLM venv's python (torch, torchvision,
`transformers`); without it every test is skipped.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from smg.pipeline.media import MediaItem
from smg.pipeline.vision import expand, processor_for
from tests.pipeline.test_vision_families import VOCAB, model_dir

PYTHON_ENV = "SMG_VLLM_PYTHON"
SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "vision_reference.py"

pytestmark = pytest.mark.skipif(
    not os.environ.get(PYTHON_ENV),
    reason=f"torch-side interop test, opt-in: run `make test-vllm` (it sets {PYTHON_ENV})",
)

# (height, width, mode, format): tiny, wide, tall, exact tile multiples (336 and 448), odd sides,
# more crops than Phi-4's 36, transparency, greyscale, palette with and without transparency, JPEG.
IMAGES = [
    (1, 1, "RGB", "PNG"),
    (7, 12, "RGB", "PNG"),
    (70, 1000, "RGB", "PNG"),
    (1200, 90, "RGB", "PNG"),
    (336, 672, "RGB", "PNG"),
    (672, 672, "RGB", "PNG"),
    (448, 896, "RGB", "PNG"),
    (333, 517, "RGB", "PNG"),
    (1001, 777, "RGB", "PNG"),
    (2700, 3200, "RGB", "JPEG"),
    (65, 130, "RGBA", "PNG"),
    (200, 150, "L", "PNG"),
    (100, 100, "P", "PNG"),
    (90, 60, "PA", "PNG"),
    (480, 640, "RGB", "JPEG"),
]

TEXT = "hi <|image|> there"
PROMPT = [VOCAB["hi"], VOCAB["<|image|>"], VOCAB["there"]]


def encoded(height: int, width: int, mode: str, fmt: str) -> bytes:
    """A noisy image over a gradient: resampling differences show in every pixel."""
    rng = np.random.default_rng(height * 10007 + width)
    ramp = np.linspace(0, 160, width)[None, :, None] + np.linspace(0, 80, height)[:, None, None]
    rgb = np.clip(ramp + rng.integers(0, 96, (height, width, 3)), 0, 255).astype(np.uint8)
    if mode == "RGBA":
        alpha = rng.integers(0, 256, (height, width, 1), dtype=np.uint8)
        image = Image.fromarray(np.concatenate([rgb, alpha], axis=2), "RGBA")
    elif mode == "L":
        image = Image.fromarray(rgb[:, :, 0], "L")
    elif mode in ("P", "PA"):
        image = Image.fromarray(rgb).quantize(16)
        if mode == "PA":
            image.info["transparency"] = 3  # palette entry 3 is transparent
    else:
        image = Image.fromarray(rgb)
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def image_id(image: tuple[int, int, str, str]) -> str:
    height, width, mode, fmt = image
    return f"{height}x{width}-{mode}-{fmt.lower()}"


def llama4_model(root: Path) -> Path:
    # meta-llama/Llama-4-Scout-17B-16E-Instruct's preprocessor_config.json and vision_config.
    pre = {
        "image_processor_type": "Llama4ImageProcessorFast",
        "processor_class": "Llama4Processor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "max_patches": 16,
        "resample": 2,
        "rescale_factor": 1 / 255,
        "resize_to_max_canvas": False,
        "size": {"height": 336, "width": 336},
    }
    config = {
        "model_type": "llama4",
        "image_token_index": VOCAB["<|patch|>"],
        "vision_config": {"image_size": 336, "patch_size": 14, "pixel_shuffle_ratio": 0.5},
    }
    return model_dir(root, config, pre)


def phi4_model(root: Path) -> Path:
    # microsoft/Phi-4-multimodal-instruct: dynamic_hd 36 over 448² crops of 14² patches, (0.5, 0.5).
    pre = {
        "image_processor_type": "Phi4MultimodalImageProcessorFast",
        "dynamic_hd": 36,
        "patch_size": 14,
        "size": {"height": 448, "width": 448},
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    return model_dir(root, {"model_type": "phi4_multimodal"}, pre)


MODELS = {"llama4": llama4_model, "phi4": phi4_model}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every image through each family's `transformers` processor, once for the module."""
    root = tmp_path_factory.mktemp("vision-reference")
    models = {family: build(root / family) for family, build in MODELS.items()}
    jobs = []
    for image in IMAGES:
        path = root / f"{image_id(image)}.{image[3].lower()}"
        path.write_bytes(encoded(*image))
        for family, directory in models.items():
            jobs.append(
                {
                    "id": f"{family}-{image_id(image)}",
                    "family": family,
                    "model_dir": str(directory),
                    "image": str(path),
                    "text": TEXT,
                }
            )
    (root / "jobs.json").write_text(json.dumps(jobs))
    out = root / "out"
    out.mkdir()
    command = [os.environ[PYTHON_ENV], str(SCRIPT), str(root / "jobs.json"), str(out)]
    done = subprocess.run(command, capture_output=True, timeout=900)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return {"models": models, "out": out}


def run_both(reference: dict[str, Any], family: str, image: tuple[int, int, str, str]) -> tuple[Any, Any, Any]:
    processor = processor_for(reference["models"][family])
    item = MediaItem(encoded(*image), f"image/{image[3].lower()}")
    ours = processor.process(item)
    ids, _ = expand(PROMPT, processor, [item])
    theirs = np.load(reference["out"] / f"{family}-{image_id(image)}.npz")
    return ours, ids, theirs


def assert_close(ours: Any, theirs: Any, atol: float) -> None:
    assert ours.shape == theirs.shape
    assert float(np.abs(ours - theirs).max()) <= atol


# Llama 4 rescales and normalizes in bfloat16 after an integer resize: every step is exact or
# rounded the one way torch rounds it, so the pixels are equal bit for bit.
LLAMA4_ATOL = 0.0


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_llama4_matches_transformers(reference: dict[str, Any], image: tuple[int, int, str, str]) -> None:
    ours, ids, theirs = run_both(reference, "llama4", image)
    assert set(theirs.files) == {"pixel_values", "aspect_ratios", "input_ids"}
    assert_close(ours.pixel_values.array(), theirs["pixel_values"], LLAMA4_ATOL)
    assert np.array_equal(ours.model_tensors["aspect_ratios"].array(), theirs["aspect_ratios"])
    assert ours.model_tensors["patches_per_image"].array().tolist() == [theirs["pixel_values"].shape[0]]
    assert ids == theirs["input_ids"][0].tolist()


# Phi-4 normalizes in float32 and resizes the global crop by bicubic in float32: torch fuses the
# rescale into the normalization and sums in its own order (the largest difference seen is 4.2e-7).
PHI4_ATOL = 1e-6


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_phi4_matches_transformers(reference: dict[str, Any], image: tuple[int, int, str, str]) -> None:
    ours, ids, theirs = run_both(reference, "phi4", image)
    assert set(theirs.files) == {
        "image_pixel_values",
        "image_sizes",
        "image_attention_mask",
        "num_img_tokens",
        "input_ids",
    }
    assert_close(ours.pixel_values.array(), theirs["image_pixel_values"], PHI4_ATOL)
    for name in ("image_sizes", "image_attention_mask", "num_img_tokens"):
        expected = theirs[name].reshape(ours.model_tensors[name].shape)
        assert np.array_equal(ours.model_tensors[name].array(), expected), name
    assert ids == theirs["input_ids"][0].tolist()
