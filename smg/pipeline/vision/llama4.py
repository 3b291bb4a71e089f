"""The Llama 4 image processor (`model_type` `llama4`, `transformers`' `Llama4ImageProcessor`).

The image is fitted to the best canvas of `tile` × `tile` chunks (every grid of at most
`max_patches` chunks; the smallest upscale that fits, else the least downscale, the smaller area
on a tie), resized without distortion to fit it (upscaling capped at one tile side), bilinear,
zero-padded right and bottom, rescaled and normalized (0.5, 0.5), and cut into tiles row by row;
a canvas of more than one tile adds the whole image resized to one tile as a last, global tile.
`pixel_values` `[tiles, 3, tile, tile]` float32, `aspect_ratios` `[1, 2]` (chunks down, across)
and `patches_per_image` `[1]` int64, as the reference gateway sends them.

As `transformers`' (torch) processor computes them: resized as torchvision resizes uint8
images (`vision.resample`), rescaled and normalized in bfloat16 (each step rounded to nearest even), so
every pixel value is a bfloat16 value, carried as float32.

The template renders one `<|image|>`; it becomes `<|image_start|>`, then for a tiled canvas each
tile's `<|patch|>` run (tiles of a row separated by `<|tile_x_separator|>`, each row ended by
`<|tile_y_separator|>`), then `<|image|>` and the global tile's `<|patch|>` run, then
`<|image_end|>`; a tile's run is (tile / patch)² / round(1 / pixel_shuffle_ratio²) tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from smg.pipeline.media import MediaItem
from smg.pipeline.vision.base import HALF, ModelFiles, Processed, Tensor, bfloat16_bits, decode, triple
from smg.pipeline.vision.resample import resize_bilinear


@dataclass(frozen=True)
class Llama4Tokens:
    image: int
    start: int
    end: int
    patch: int
    tile_x: int
    tile_y: int


@dataclass(frozen=True)
class Llama4Processor:
    tokens: Llama4Tokens
    tile: int = 336
    max_patches: int = 16
    patch_size: int = 14
    pixel_shuffle_ratio: float = 0.5
    resize_to_max_canvas: bool = False
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF

    @classmethod
    def from_files(cls, files: ModelFiles) -> Llama4Processor:
        pre = files.preprocessor
        size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
        vision = files.sub("vision_config")
        return cls(
            tokens=Llama4Tokens(
                image=files.token_id("<|image|>"),
                start=files.token_id("<|image_start|>"),
                end=files.token_id("<|image_end|>"),
                patch=files.token_id("<|patch|>"),
                tile_x=files.token_id("<|tile_x_separator|>"),
                tile_y=files.token_id("<|tile_y_separator|>"),
            ),
            tile=int((size or {}).get("height") or vision.get("image_size") or 336),
            max_patches=int(pre.get("max_patches") or 16),
            patch_size=int(vision.get("patch_size") or 14),
            pixel_shuffle_ratio=float(vision.get("pixel_shuffle_ratio") or 0.5),
            resize_to_max_canvas=bool(pre.get("resize_to_max_canvas", False)),
            mean=triple(pre.get("image_mean"), HALF),
            std=triple(pre.get("image_std"), HALF),
        )

    @property
    def max_images(self) -> int | None:
        return 8  # Llama 4: 8, as the reference gateway allows

    @property
    def placeholder_token_id(self) -> int:
        return self.tokens.image

    @cached_property
    def canvases(self) -> list[tuple[int, int]]:
        """Every (height, width) of at most `max_patches` tiles, in `transformers`' order."""
        by_ratio: dict[float, list[tuple[int, int]]] = {}
        for chunks in range(self.max_patches, 0, -1):
            factors = sorted({f for i in range(1, math.isqrt(chunks) + 1) if chunks % i == 0 for f in (i, chunks // i)})
            for down in factors:
                by_ratio.setdefault(down / (chunks // down), []).append((down, chunks // down))
        return [(h * self.tile, w * self.tile) for grids in by_ratio.values() for h, w in grids]

    def best_canvas(self, height: int, width: int) -> tuple[int, int]:
        scales = [min(h / height, w / width) for h, w in self.canvases]
        up = [s for s in scales if s >= 1]
        chosen = (max(up) if self.resize_to_max_canvas else min(up)) if up else max(scales)
        fitting = [c for c, s in zip(self.canvases, scales, strict=True) if s == chosen]
        return min(fitting, key=lambda c: c[0] * c[1])

    @staticmethod
    def fit_without_distortion(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
        target_h, target_w = target
        scale_w, scale_h = target_w / width, target_h / height
        if scale_w < scale_h:
            return max(1, min(math.floor(height * scale_w), target_h)), max(1, target_w)
        return max(1, target_h), max(1, min(math.floor(width * scale_h), target_w))

    def tokens_per_tile(self) -> int:
        return (self.tile // self.patch_size) ** 2 // round(1 / self.pixel_shuffle_ratio**2)

    def process(self, item: MediaItem) -> Processed:
        import numpy as np

        image = np.asarray(decode(item))
        height, width = image.shape[:2]
        canvas_h, canvas_w = self.best_canvas(height, width)
        if self.resize_to_max_canvas:
            bound = (canvas_h, canvas_w)
        else:
            bound = (min(max(height, self.tile), canvas_h), min(max(width, self.tile), canvas_w))
        new_h, new_w = self.fit_without_distortion(height, width, bound)
        padded = np.zeros((canvas_h, canvas_w, 3), dtype=np.uint8)
        padded[:new_h, :new_w] = resize_bilinear(image, new_h, new_w)
        down, across = canvas_h // self.tile, canvas_w // self.tile
        chw = self.normalized(padded)
        tiles = chw.reshape(3, down, self.tile, across, self.tile).transpose(1, 3, 0, 2, 4)
        tiles = tiles.reshape(down * across, 3, self.tile, self.tile)
        if down * across > 1:
            whole = resize_bilinear(image, self.tile, self.tile)
            tiles = np.concatenate([tiles, self.normalized(whole)[None]])
        return Processed(
            pixel_values=Tensor.of(tiles),
            model_tensors={
                "aspect_ratios": Tensor.of(np.asarray([[down, across]], dtype=np.int64)),
                "patches_per_image": Tensor.of(np.asarray([tiles.shape[0]], dtype=np.int64)),
            },
            tokens=self.prompt_tokens(down, across),
            embed_token_id=self.tokens.patch,
            flat=True,
        )

    def normalized(self, pixels: Any) -> Any:
        """`[H, W, 3]` uint8 as float32 `[3, H, W]`: rescaled, then normalized, in bfloat16."""
        import numpy as np

        mean = bfloat16(np.asarray(self.mean, dtype=np.float32))
        std = bfloat16(np.asarray(self.std, dtype=np.float32))
        scaled = bfloat16(pixels.astype(np.float32) * np.float32(1 / 255))
        return bfloat16(bfloat16(scaled - mean) / std).transpose(2, 0, 1)

    def prompt_tokens(self, down: int, across: int) -> tuple[int, ...]:
        t = self.tokens
        run = [t.patch] * self.tokens_per_tile()
        out = [t.start]
        if down * across > 1:
            for _ in range(down):
                for x in range(across):
                    out += run
                    if x < across - 1:
                        out.append(t.tile_x)
                out.append(t.tile_y)
        out += [t.image, *run, t.end]
        return tuple(out)


def bfloat16(values: Any) -> Any:
    """float32 values rounded to bfloat16 (as torch rounds), as float32."""
    return bfloat16_bits(values).view("<f4")
