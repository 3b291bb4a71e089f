"""The Qwen-VL image processor: Qwen2-VL, Qwen2.5-VL and Qwen3-VL (`model_type` `qwen2_vl`,
`qwen2_5_vl`, `qwen3_vl`, `qwen3_vl_moe`; `transformers`' `Qwen2VLImageProcessor` serves all three).

The size is snapped to multiples of patch × merge within `min_pixels`..`max_pixels` (an aspect
ratio above 200 refused), bicubic resize, rescale and normalization (CLIP for Qwen2, 0.5 for
Qwen3 per its `preprocessor_config.json`), the frame repeated to the temporal patch, patches laid
out merge-window by merge-window as `[patches, C·T·P·P]` float32, `image_grid_thw` `[1, 3]` int64
beside it. The template renders `<|vision_start|><|image_pad|><|vision_end|>`; the one
`<|image_pad|>` becomes `t·h·w / merge²` copies of itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smg.pipeline.media import MediaItem, processing_failed
from smg.pipeline.vision.base import (
    CLIP_MEAN,
    CLIP_STD,
    ModelFiles,
    Processed,
    Tensor,
    config_missing,
    decode,
    normalized,
    triple,
)

QWEN_VL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class QwenVlProcessor:
    """The Qwen-VL image processor's settings, read from a model directory."""

    image_token_id: int
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @classmethod
    def from_model_dir(cls, model_dir: str | Path | None) -> QwenVlProcessor:
        files = ModelFiles.at(model_dir)
        if files.model_type not in QWEN_VL_TYPES:
            raise config_missing(
                f"No image processor for model type {files.model_type!r} (known: {', '.join(sorted(QWEN_VL_TYPES))})"
            )
        return cls.from_files(files)

    @classmethod
    def from_files(cls, files: ModelFiles) -> QwenVlProcessor:
        pre = files.preprocessor
        size: dict[str, Any] = pre["size"] if isinstance(pre.get("size"), dict) else {}
        vision = files.sub("vision_config")
        return cls(
            image_token_id=files.config_id("image_token_id"),
            patch_size=int(pre.get("patch_size") or vision.get("patch_size") or 14),
            merge_size=int(pre.get("merge_size") or vision.get("spatial_merge_size") or 2),
            temporal_patch_size=int(pre.get("temporal_patch_size") or vision.get("temporal_patch_size") or 2),
            min_pixels=int(pre.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
            max_pixels=int(pre.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
            mean=triple(pre.get("image_mean"), CLIP_MEAN),
            std=triple(pre.get("image_std"), CLIP_STD),
        )

    @property
    def max_images(self) -> int | None:
        return 10  # Qwen-VL: 10, as the reference gateway allows

    @property
    def placeholder_token_id(self) -> int:
        return self.image_token_id

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """The resized (height, width): multiples of patch × merge, the area within bounds."""
        factor = self.patch_size * self.merge_size
        if max(height, width) / max(1, min(height, width)) > MAX_ASPECT_RATIO:
            raise processing_failed(f"Image aspect ratio must be at most {MAX_ASPECT_RATIO}, got {width}x{height}")
        h = max(factor, round(height / factor) * factor)
        w = max(factor, round(width / factor) * factor)
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h = max(factor, math.floor(height / beta / factor) * factor)
            w = max(factor, math.floor(width / beta / factor) * factor)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h = math.ceil(height * beta / factor) * factor
            w = math.ceil(width * beta / factor) * factor
        return h, w

    def pixels(self, item: MediaItem) -> tuple[Tensor, tuple[int, int, int]]:
        """The image's patches and its (t, h, w) grid."""
        import numpy as np
        from PIL import Image

        image = decode(item)
        height, width = self.target_size(image.height, image.width)
        image = image.resize((width, height), Image.Resampling.BICUBIC)
        frames = np.repeat(normalized(image, self.mean, self.std)[None], self.temporal_patch_size, axis=0)
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // p, width // p
        patches = frames.reshape(1, t, 3, grid_h // m, m, p, grid_w // m, m, p)
        patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return Tensor.of(patches.reshape(grid_h * grid_w, 3 * t * p * p)), (1, grid_h, grid_w)

    def tokens_for(self, grid: tuple[int, int, int]) -> int:
        t, h, w = grid
        return t * h * w // (self.merge_size * self.merge_size)

    def process(self, item: MediaItem) -> Processed:
        import numpy as np

        pixel_values, grid = self.pixels(item)
        return Processed(
            pixel_values=pixel_values,
            model_tensors={"image_grid_thw": Tensor.of(np.asarray([grid], dtype=np.int64))},
            tokens=(self.image_token_id,) * self.tokens_for(grid),
            embed_token_id=self.image_token_id,
            flat=True,
        )
