"""The gateway's Qwen2-VL image preprocessing against transformers' own processor, and the prompt's
placeholders expanded to match."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from smg.pipeline.media import MediaItem
from smg.pipeline.vision import QwenVlProcessor, expand
from smg.protocol.errors import ApiError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen2vl"


def png(height: int, width: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize(("height", "width"), [(70, 100), (20, 300), (400, 90)])
def test_pixels_match_transformers_qwen2_vl_processor(height: int, width: int) -> None:
    from transformers import Qwen2VLImageProcessorPil

    processor = QwenVlProcessor.from_model_dir(FIXTURE)
    data = png(height, width)
    tensor, grid = processor.pixels(MediaItem(data, "image/png"))
    reference = Qwen2VLImageProcessorPil(
        min_pixels=processor.min_pixels, max_pixels=processor.max_pixels, patch_size=14, merge_size=2,
        temporal_patch_size=2,
    )(images=[Image.open(io.BytesIO(data))], return_tensors="np")
    assert list(reference["image_grid_thw"][0]) == list(grid)
    ours = np.frombuffer(tensor.data, dtype="<f4").reshape(tensor.shape)
    assert ours.shape == reference["pixel_values"].shape
    assert np.allclose(ours, reference["pixel_values"], atol=1e-5)


def test_each_placeholder_expands_to_its_image_tokens() -> None:
    processor = QwenVlProcessor.from_model_dir(FIXTURE)
    pad = processor.image_token_id
    images = [MediaItem(png(70, 100), "image/png"), MediaItem(png(56, 56, seed=1), "image/png")]
    ids, items = expand([1, pad, 2, 3, pad, 4], processor, images)
    assert [(i.offset, i.length, i.grid_thw) for i in items] == [(1, 8, (1, 4, 8)), (11, 4, (1, 4, 4))]
    assert ids == [1, *[pad] * 8, 2, 3, *[pad] * 4, 4]
    assert items[0].content_hash != items[1].content_hash


def test_placeholders_not_matching_the_images_are_refused() -> None:
    processor = QwenVlProcessor.from_model_dir(FIXTURE)
    with pytest.raises(ApiError) as refused:
        expand([1, 2], processor, [MediaItem(png(56, 56), "image/png")])
    assert refused.value.code == "multimodal_prompt_contract_mismatch"


def test_a_model_without_a_known_processor_is_config_missing() -> None:
    with pytest.raises(ApiError) as refused:
        QwenVlProcessor.from_model_dir(FIXTURE.parent / "qwen3")
    assert refused.value.code == "multimodal_config_missing"


def test_undecodable_bytes_are_processing_failed() -> None:
    processor = QwenVlProcessor.from_model_dir(FIXTURE)
    with pytest.raises(ApiError) as refused:
        processor.pixels(MediaItem(b"not an image", "image/png"))
    assert refused.value.code == "multimodal_processing_failed"
