"""Images made into what a vision encoder takes, and the prompt's placeholders expanded to match.

The gateway preprocesses (the engines' encode workers run only the tower): an image is decoded,
resized and normalized per the model's `preprocessor_config.json`, and cut into patches. One
family is known, the Qwen2-VL processor (`model_type` `qwen2_vl` / `qwen2_5_vl`, as the reference
gateway's `qwen_vl` spec matches): the size snapped to multiples of patch × merge within
`min_pixels`..`max_pixels`, bicubic resize, rescale and CLIP normalization, the frame repeated to
the temporal patch, patches laid out merge-window by merge-window as `[patches, C·T·P·P]`
float32, and `image_grid_thw` beside it. Each image is one `<|image_pad|>` in the rendered
prompt (the template's placeholder) and becomes `t·h·w / merge²` copies of it.

A model without a known processor is 400 `multimodal_config_missing`; a rendered prompt whose
placeholders do not match the images one for one is 400 `multimodal_prompt_contract_mismatch`.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smg.pipeline.media import MediaItem, processing_failed
from smg.protocol.errors import ApiError

QWEN_VL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200


def config_missing(message: str) -> ApiError:
    return ApiError(400, message, code="multimodal_config_missing")


@dataclass(frozen=True)
class Tensor:
    """A tensor as the engine protocols carry it: little-endian bytes, shape and dtype."""

    shape: tuple[int, ...]
    dtype: str  # "float32", "int64"
    data: bytes


@dataclass(frozen=True)
class VisionItem:
    """One preprocessed image and where its tokens sit in the expanded prompt."""

    content_hash: bytes
    pixel_values: Tensor
    grid_thw: tuple[int, int, int]
    offset: int  # of its first placeholder token in the prompt ids
    length: int  # its placeholder tokens
    placeholder_token_id: int

    @property
    def model_tensors(self) -> dict[str, Tensor]:
        data = b"".join(v.to_bytes(8, "little", signed=True) for v in self.grid_thw)
        return {"image_grid_thw": Tensor(shape=(1, 3), dtype="int64", data=data)}


@dataclass(frozen=True)
class QwenVlProcessor:
    """The Qwen2-VL image processor's settings, read from a model directory."""

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
        if model_dir is None or not Path(model_dir).is_dir():
            raise config_missing("Image inputs need the model's config: start the gateway with --model-path DIR")
        root = Path(model_dir)
        config = _read_json(root / "config.json")
        if config.get("model_type") not in QWEN_VL_TYPES:
            raise config_missing(
                f"No image processor for model type {config.get('model_type')!r} "
                f"(known: {', '.join(sorted(QWEN_VL_TYPES))})"
            )
        token = config.get("image_token_id")
        if not isinstance(token, int):
            raise config_missing("The model's config.json has no image_token_id")
        pre = _read_json(root / "preprocessor_config.json")
        size: dict[str, Any] = pre["size"] if isinstance(pre.get("size"), dict) else {}
        vision: dict[str, Any] = config["vision_config"] if isinstance(config.get("vision_config"), dict) else {}
        return cls(
            image_token_id=token,
            patch_size=int(pre.get("patch_size") or vision.get("patch_size") or 14),
            merge_size=int(pre.get("merge_size") or vision.get("spatial_merge_size") or 2),
            temporal_patch_size=int(pre.get("temporal_patch_size") or vision.get("temporal_patch_size") or 2),
            min_pixels=int(pre.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
            max_pixels=int(pre.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
            mean=_triple(pre.get("image_mean"), CLIP_MEAN),
            std=_triple(pre.get("image_std"), CLIP_STD),
        )

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
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(item.data)) as opened:
                image = opened.convert("RGB")
        except UnidentifiedImageError:
            # PIL's own text names the buffer object (`<_io.BytesIO object at 0x…>`): never shown.
            raise processing_failed("Failed to decode image: not a recognised image format") from None
        except Image.DecompressionBombError:
            raise processing_failed("Failed to decode image: it has too many pixels to decode") from None
        except (OSError, ValueError, SyntaxError):
            raise processing_failed("Failed to decode image: the image data is damaged or truncated") from None
        height, width = self.target_size(image.height, image.width)
        image = image.resize((width, height), Image.Resampling.BICUBIC)
        scaled = np.asarray(image, dtype=np.float32) / np.float32(255.0)
        array = (scaled - np.asarray(self.mean, dtype=np.float32)) / np.asarray(self.std, dtype=np.float32)
        frames = np.repeat(array.transpose(2, 0, 1)[None], self.temporal_patch_size, axis=0)  # T, C, H, W
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // p, width // p
        patches = frames.reshape(1, t, 3, grid_h // m, m, p, grid_w // m, m, p)
        patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = np.ascontiguousarray(patches.reshape(grid_h * grid_w, 3 * t * p * p), dtype="<f4")
        pixel_values = Tensor(shape=tuple(int(d) for d in flat.shape), dtype="float32", data=flat.tobytes())
        return pixel_values, (1, grid_h, grid_w)

    def tokens_for(self, grid: tuple[int, int, int]) -> int:
        t, h, w = grid
        return t * h * w // (self.merge_size * self.merge_size)


def expand(ids: list[int], processor: QwenVlProcessor, images: list[MediaItem]) -> tuple[list[int], list[VisionItem]]:
    """The prompt ids with each image's placeholder expanded to its tokens, and the images' items."""
    token = processor.image_token_id
    positions = [i for i, t in enumerate(ids) if t == token]
    if len(positions) != len(images):
        raise ApiError(
            400,
            f"The rendered prompt has {len(positions)} image placeholders for {len(images)} images",
            code="multimodal_prompt_contract_mismatch",
        )
    out: list[int] = []
    items: list[VisionItem] = []
    start = 0
    for position, image in zip(positions, images, strict=True):
        out.extend(ids[start:position])
        pixel_values, grid = processor.pixels(image)
        length = processor.tokens_for(grid)
        items.append(
            VisionItem(
                content_hash=image.content_hash,
                pixel_values=pixel_values,
                grid_thw=grid,
                offset=len(out),
                length=length,
                placeholder_token_id=token,
            )
        )
        out.extend([token] * length)
        start = position + 1
    out.extend(ids[start:])
    return out, items


def _triple(value: Any, default: tuple[float, float, float]) -> tuple[float, float, float]:
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int | float) for v in value):
        return float(value[0]), float(value[1]), float(value[2])
    return default


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise config_missing(f"Failed to read {path.name}: {exc}") from None
    return value if isinstance(value, dict) else {}
