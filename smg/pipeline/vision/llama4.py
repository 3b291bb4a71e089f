"""The Llama 4 image processor (`model_type` `llama4`, `transformers`' `Llama4ImageProcessor`).

The image is fitted to the best canvas of `tile` × `tile` chunks (every grid of at most
`max_patches` chunks; the smallest upscale that fits, else the least downscale, the smaller area
on a tie), resized without distortion to fit it (upscaling capped at one tile side), bilinear,
zero-padded right and bottom, rescaled and normalized (0.5, 0.5), and cut into tiles row by row;
a canvas of more than one tile adds the whole image resized to one tile as a last, global tile.
`pixel_values` `[tiles, 3, tile, tile]` float32, `aspect_ratios` `[1, 2]` (chunks down, across)
and `patches_per_image` `[1]` int64, as the reference gateway sends them.

`transformers` runs this processor in torch only, resizing with torchvision's antialiased
bilinear and normalizing in bfloat16; here PIL's bilinear and float32 are used, as the reference
gateway does.

The template renders one `<|image|>`; it becomes `<|image_start|>`, then for a tiled canvas each
tile's `<|patch|>` run (tiles of a row separated by `<|tile_x_separator|>`, each row ended by
`<|tile_y_separator|>`), then `<|image|>` and the global tile's `<|patch|>` run, then
`<|image_end|>`; a tile's run is (tile / patch)² / round(1 / pixel_shuffle_ratio²) tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from smg.pipeline.media import MediaItem
from smg.pipeline.vision.base import HALF, ModelFiles, Processed, Tensor, decode, normalized, triple


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
        from PIL import Image

        image = decode(item)
        canvas_h, canvas_w = self.best_canvas(image.height, image.width)
        if self.resize_to_max_canvas:
            bound = (canvas_h, canvas_w)
        else:
            bound = (min(max(image.height, self.tile), canvas_h), min(max(image.width, self.tile), canvas_w))
        new_h, new_w = self.fit_without_distortion(image.height, image.width, bound)
        padded = Image.new("RGB", (canvas_w, canvas_h), (0, 0, 0))
        padded.paste(image.resize((new_w, new_h), Image.Resampling.BILINEAR), (0, 0))
        down, across = canvas_h // self.tile, canvas_w // self.tile
        chw = normalized(padded, self.mean, self.std)
        tiles = chw.reshape(3, down, self.tile, across, self.tile).transpose(1, 3, 0, 2, 4)
        tiles = tiles.reshape(down * across, 3, self.tile, self.tile)
        if down * across > 1:
            whole = image.resize((self.tile, self.tile), Image.Resampling.BILINEAR)
            tiles = np.concatenate([tiles, normalized(whole, self.mean, self.std)[None]])
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
