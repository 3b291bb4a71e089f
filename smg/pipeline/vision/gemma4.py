"""The Gemma 4 image processor (`model_type` `gemma4`, `transformers`' `Gemma4ImageProcessor`).

The image keeps its aspect ratio: scaled to the largest size whose sides are multiples of
patch × pooling kernel and whose patches fit `max_soft_tokens` × kernel² (a side rounding to zero
becomes one multiple), bicubic resize, rescaled to [0, 1] (normalized only if the config asks),
cut into patches laid out row by row, each `[P, P, C]` flattened. `pixel_values`
`[1, max_patches, P·P·3]` float32 zero-padded, `image_position_ids` `[1, max_patches, 2]` int64
(x, y per patch, -1 in the padding). The template renders one `<|image|>`; it becomes
the start token (`boi_token_id`) + patches / kernel² × `<|image|>` + the end token (`eoi_token_id`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from smg.pipeline.media import MediaItem, processing_failed
from smg.pipeline.vision.base import HALF, ModelFiles, Processed, Tensor, config_missing, decode, normalized, triple

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


@dataclass(frozen=True)
class Gemma4Processor:
    image_token_id: int
    boi_token_id: int
    eoi_token_id: int
    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3
    normalize: bool = False
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF

    @classmethod
    def from_files(cls, files: ModelFiles) -> Gemma4Processor:
        pre = files.preprocessor
        budget = int(pre.get("max_soft_tokens") or 280)
        if budget not in SOFT_TOKEN_BUDGETS:
            raise config_missing(f"Gemma 4 max_soft_tokens must be one of {SOFT_TOKEN_BUDGETS}, got {budget}")
        return cls(
            image_token_id=files.config_id("image_token_id", "image_token_index"),
            boi_token_id=files.config_id("boi_token_id", "boi_token_index"),
            eoi_token_id=files.config_id("eoi_token_id", "eoi_token_index"),
            patch_size=int(pre.get("patch_size") or 16),
            max_soft_tokens=budget,
            pooling_kernel_size=int(pre.get("pooling_kernel_size") or 3),
            normalize=bool(pre.get("do_normalize", False)),
            mean=triple(pre.get("image_mean"), HALF),
            std=triple(pre.get("image_std"), HALF),
        )

    @property
    def max_images(self) -> int | None:
        return None  # the reference gateway names no limit for this family: `--media-max-items` only

    @property
    def placeholder_token_id(self) -> int:
        return self.image_token_id

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size**2

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        target_px = self.max_patches * self.patch_size**2
        factor = math.sqrt(target_px / (height * width))
        side = self.pooling_kernel_size * self.patch_size
        h = math.floor(factor * height / side) * side
        w = math.floor(factor * width / side) * side
        longest = (self.max_patches // self.pooling_kernel_size**2) * side
        if h == 0 and w == 0:
            raise processing_failed(f"Image {width}x{height} is too small to encode")
        if h == 0:
            h, w = side, min(math.floor(width / height) * side, longest)
        elif w == 0:
            h, w = min(math.floor(height / width) * side, longest), side
        if h * w > target_px:
            raise processing_failed(f"Image aspect ratio of {width}x{height} is too extreme to encode")
        return h, w

    def process(self, item: MediaItem) -> Processed:
        import numpy as np
        from PIL import Image

        image = decode(item)
        height, width = self.target_size(image.height, image.width)
        image = image.resize((width, height), Image.Resampling.BICUBIC)
        mean, std = (self.mean, self.std) if self.normalize else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
        chw = normalized(image, mean, std)
        p = self.patch_size
        rows, cols = height // p, width // p
        patches = chw.reshape(3, rows, p, cols, p).transpose(1, 3, 2, 4, 0).reshape(rows * cols, p * p * 3)
        grid_x, grid_y = np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy")
        positions = np.stack([grid_x, grid_y], axis=-1).reshape(rows * cols, 2)
        padding = self.max_patches - rows * cols
        patches = np.pad(patches, ((0, padding), (0, 0)))
        positions = np.pad(positions, ((0, padding), (0, 0)), constant_values=-1)
        soft = rows * cols // self.pooling_kernel_size**2
        return Processed(
            pixel_values=Tensor.of(patches[None]),
            model_tensors={"image_position_ids": Tensor.of(positions[None].astype(np.int64))},
            tokens=(self.boi_token_id, *(self.image_token_id,) * soft, self.eoi_token_id),
            embed_token_id=self.image_token_id,
        )
