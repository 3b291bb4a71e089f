"""The Pixtral image processor: Pixtral and Mistral 3 (`transformers`' `PixtralImageProcessor`).

The image is scaled down (never up) to fit `longest_edge` (floor of the sides), each side then
rounded up to a multiple of the effective patch (patch × the model's spatial merge), bicubic
resize, rescale and CLIP normalization; `pixel_values` `[1, 3, H, W]` float32 and `image_sizes`
`[1, 2]` int64 (height, width). The template renders one `[IMG]`; it becomes rows of `[IMG]` (one
per patch column) each closed by `[IMG_BREAK]`, the last closed by `[IMG_END]` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from smg.pipeline.media import MediaItem
from smg.pipeline.vision.base import CLIP_MEAN, CLIP_STD, ModelFiles, Processed, Tensor, decode, normalized, triple


@dataclass(frozen=True)
class PixtralProcessor:
    image_token_id: int
    break_token_id: int
    end_token_id: int
    patch_size: int = 16  # effective: the vision patch × the spatial merge
    longest_edge: int = 1024
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @classmethod
    def from_files(cls, files: ModelFiles) -> PixtralProcessor:
        pre = files.preprocessor
        size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
        patch = pre.get("patch_size")
        if isinstance(patch, dict):
            patch = patch.get("height")
        patch = int(patch or files.sub("vision_config").get("patch_size") or 16)
        merge = int(files.config.get("spatial_merge_size") or 1)
        return cls(
            image_token_id=files.config_id("image_token_index", "image_token_id"),
            break_token_id=files.token_id("[IMG_BREAK]"),
            end_token_id=files.token_id("[IMG_END]"),
            patch_size=patch * merge,
            longest_edge=int((size or {}).get("longest_edge") or 1024),
            mean=triple(pre.get("image_mean"), CLIP_MEAN),
            std=triple(pre.get("image_std"), CLIP_STD),
        )

    @property
    def max_images(self) -> int | None:
        return None  # the reference gateway names no limit for this family: `--media-max-items` only

    @property
    def placeholder_token_id(self) -> int:
        return self.image_token_id

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        ratio = max(height / self.longest_edge, width / self.longest_edge)
        if ratio > 1:
            height, width = math.floor(height / ratio), math.floor(width / ratio)
        p = self.patch_size
        return ((height - 1) // p + 1) * p, ((width - 1) // p + 1) * p

    def process(self, item: MediaItem) -> Processed:
        import numpy as np
        from PIL import Image

        image = decode(item)
        height, width = self.target_size(image.height, image.width)
        image = image.resize((width, height), Image.Resampling.BICUBIC)
        pixels = normalized(image, self.mean, self.std)[None]
        row = (self.image_token_id,) * (width // self.patch_size) + (self.break_token_id,)
        tokens = row * (height // self.patch_size)
        return Processed(
            pixel_values=Tensor.of(pixels),
            model_tensors={"image_sizes": Tensor.of(np.asarray([[height, width]], dtype=np.int64))},
            tokens=(*tokens[:-1], self.end_token_id),
            embed_token_id=self.image_token_id,
        )
