"""The Phi-4 multimodal image processor (`model_type` `phi4_multimodal` / `phi4mm`,
`transformers`' `Phi4MultimodalImageProcessor`, dynamic HD).

The image is laid on a grid of `crop` × `crop` crops: as many as its sides need, or, past
`dynamic_hd` crops, the grid of at most `dynamic_hd` whose aspect ratio is closest (the later,
larger grid on a tie when the image covers more than half of it). It is resized to fill the grid's
width or height (bilinear), padded white right or bottom, rescaled and normalized (0.5, 0.5); the
global crop is that padded image resized to one crop by bicubic interpolation without antialias
(PyTorch's `interpolate(mode="bicubic", align_corners=False)`), first, then the crops row by row.
`image_pixel_values` `[1, 1 + crops, 3, crop, crop]` float32, `image_sizes` `[1, 2]` int64 (the
padded height, width), `image_attention_mask` `[1, 1 + crops, crop/patch, crop/patch]` float32
(0 over whole padded patches) and `num_img_tokens` `[1]` int64. The template renders one
`<|image|>`; it becomes `num_img_tokens` copies: 256 global + 1 separator + the HD mask's
patches (every second row and column) + one newline per HD row + 16.

The first resize is torchvision's antialiased bilinear of the uint8 image (`vision.resample`),
as `transformers`' (torch) processor resizes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from smg.pipeline.media import MediaItem, processing_failed
from smg.pipeline.vision.base import HALF, ModelFiles, Processed, Tensor, decode, normalized, triple
from smg.pipeline.vision.resample import resize_bilinear

GLOBAL_TOKENS = 256
SEPARATOR_TOKENS = 1
TRAILING_TOKENS = 16


@dataclass(frozen=True)
class Phi4Processor:
    image_token_id: int
    crop: int = 448
    patch_size: int = 14
    dynamic_hd: int = 36
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF

    @classmethod
    def from_files(cls, files: ModelFiles) -> Phi4Processor:
        pre = files.preprocessor
        size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
        return cls(
            image_token_id=files.token_id("<|image|>"),
            crop=int((size or {}).get("height") or 448),
            patch_size=int(pre.get("patch_size") or 14),
            dynamic_hd=int(pre.get("dynamic_hd") or 36),
            mean=triple(pre.get("image_mean"), HALF),
            std=triple(pre.get("image_std"), HALF),
        )

    @property
    def max_images(self) -> int | None:
        return None  # the reference gateway names no limit for this family: `--media-max-items` only

    @property
    def placeholder_token_id(self) -> int:
        return self.image_token_id

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The crops (across, down) for an image of `height` × `width`."""
        across, down = math.ceil(width / self.crop), math.ceil(height / self.crop)
        if across * down <= self.dynamic_hd:
            return across, down
        most = self.dynamic_hd
        # Built as `transformers` builds it: equal-area grids keep that set's iteration order.
        grids = {(i, j) for n in range(1, most + 1) for i in range(1, n + 1) for j in range(1, n + 1) if i * j <= most}
        ratios = sorted(grids, key=lambda r: r[0] * r[1])
        aspect = width / height
        best, best_diff = (1, 1), math.inf
        for ratio in ratios:
            diff = abs(aspect - ratio[0] / ratio[1])
            if diff < best_diff:
                best, best_diff = ratio, diff
            elif diff == best_diff and width * height > 0.5 * self.crop * self.crop * ratio[0] * ratio[1]:
                best = ratio
        return best

    def process(self, item: MediaItem) -> Processed:
        import numpy as np

        image = np.asarray(decode(item))
        height, width = image.shape[:2]
        across, down = self.grid(height, width)
        target_w, target_h = self.crop * across, self.crop * down
        if target_w / width < target_h / height:
            new_w, new_h = target_w, int(height * (target_w / width))
        else:
            new_w, new_h = int(width * (target_h / height)), target_h
        if min(new_h, target_h) < 10 or min(new_w, target_w) < 10:
            raise processing_failed(f"Image aspect ratio of {width}x{height} is too extreme to encode")
        pad_w, pad_h = target_w - new_w, target_h - new_h
        canvas = np.full((target_h, target_w, 3), 255, dtype=np.uint8)
        canvas[:new_h, :new_w] = resize_bilinear(image, new_h, new_w)
        hd = normalized(canvas, self.mean, self.std)
        whole = bicubic(hd, self.crop, self.crop)
        crops = hd.reshape(3, down, self.crop, across, self.crop).transpose(1, 3, 0, 2, 4)
        crops = crops.reshape(down * across, 3, self.crop, self.crop)

        cells = self.crop // self.patch_size
        mask = np.ones((cells * down, cells * across), dtype=np.float32)
        if pad_w >= self.patch_size:
            mask[:, -(pad_w // self.patch_size) :] = 0
        if pad_h >= self.patch_size:
            mask[-(pad_h // self.patch_size) :, :] = 0
        per_crop = mask.reshape(down, cells, across, cells).transpose(0, 2, 1, 3).reshape(-1, cells, cells)
        half = per_crop[:, 0::2, 0::2]
        side = half.shape[-1]
        sampled = half.reshape(down, across, side, side).transpose(0, 2, 1, 3).reshape(down * side, across * side)
        tokens = GLOBAL_TOKENS + SEPARATOR_TOKENS + int(sampled.sum()) + int(sampled[:, 0].sum()) + TRAILING_TOKENS
        masks = np.concatenate([np.ones((1, cells, cells), dtype=np.float32), per_crop])
        return Processed(
            pixel_values=Tensor.of(np.concatenate([whole[None], crops])[None]),
            model_tensors={
                "image_sizes": Tensor.of(np.asarray([[target_h, target_w]], dtype=np.int64)),
                "image_attention_mask": Tensor.of(masks[None]),
                "num_img_tokens": Tensor.of(np.asarray([tokens], dtype=np.int64)),
            },
            tokens=(self.image_token_id,) * tokens,
            embed_token_id=self.image_token_id,
        )


def bicubic(chw: Any, height: int, width: int) -> Any:
    """`[C, H, W]` resized as PyTorch's bicubic `interpolate` (A = -0.75, half-pixel centres,
    edges clamped, no antialias)."""
    import numpy as np

    def weights(size_in: int, size_out: int) -> tuple[Any, Any]:
        src = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
        base = np.floor(src)
        t = src - base
        a = -0.75
        w = np.stack(
            [
                ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                ((a + 2) * t - (a + 3)) * t * t + 1,
                ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
                ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
            ],
            axis=1,
        )
        index = np.clip(base[:, None].astype(np.int64) + np.arange(-1, 3), 0, size_in - 1)
        return index, w.astype(np.float32)

    rows, row_w = weights(chw.shape[1], height)
    cols, col_w = weights(chw.shape[2], width)
    across = (chw[:, :, cols] * col_w[None, None]).sum(axis=-1)  # C, H_in, W_out
    return (across[:, rows, :] * row_w[None, :, :, None]).sum(axis=2).astype(np.float32)  # C, H_out, W_out
