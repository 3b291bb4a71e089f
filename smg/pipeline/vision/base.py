"""What every image processor shares: the tensors it hands the engines, one processed image, the
decoding of image bytes, and the model files its settings come from.

An image processor (one module per model family) turns one decoded image into its encoder input
(`pixel_values`), the family's other tensors (grids, sizes, masks, position ids) and the token ids
that replace the image's one placeholder in the rendered prompt. Decoding is the `transformers`
processors' own: the image converted to RGB, any transparency composited onto white.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from smg.pipeline.media import MediaItem, processing_failed
from smg.protocol.errors import ApiError

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)


def config_missing(message: str) -> ApiError:
    return ApiError(400, message, code="multimodal_config_missing")


@dataclass(frozen=True)
class Tensor:
    """A tensor as the engine protocols carry it: little-endian bytes, shape and dtype."""

    shape: tuple[int, ...]
    dtype: str  # "float32", "int64"
    data: bytes

    @classmethod
    def of(cls, array: np.ndarray[Any, Any]) -> Tensor:
        """An int array as int64, anything else as float32, little-endian and contiguous."""
        import numpy as np

        dtype = "int64" if np.issubdtype(array.dtype, np.integer) else "float32"
        flat = np.ascontiguousarray(array, dtype="<i8" if dtype == "int64" else "<f4")
        return cls(shape=tuple(int(d) for d in flat.shape), dtype=dtype, data=flat.tobytes())

    def array(self) -> np.ndarray[Any, Any]:
        import numpy as np

        return np.frombuffer(self.data, dtype="<i8" if self.dtype == "int64" else "<f4").reshape(self.shape)


@dataclass(frozen=True)
class Processed:
    """One image as its family's encoder takes it, and the tokens standing for it in the prompt."""

    pixel_values: Tensor
    model_tensors: dict[str, Tensor]
    tokens: tuple[int, ...]  # replace the image's placeholder, wrappers and separators included
    embed_token_id: int  # the positions among `tokens` that receive the image's embeddings
    flat: bool = False  # `pixel_values` has no image dimension: images' pixels are concatenated


class ImageProcessor(Protocol):
    """A model family's image preprocessing, its settings read from the model's files."""

    @property
    def placeholder_token_id(self) -> int:
        """The one token the chat template renders for an image."""
        ...

    @property
    def max_images(self) -> int | None:
        """Images one request may carry for this family (the reference gateway's limit), if any."""
        ...

    def process(self, item: MediaItem) -> Processed: ...


@dataclass(frozen=True)
class VisionItem:
    """One preprocessed image and where its tokens sit in the expanded prompt."""

    content_hash: bytes
    pixel_values: Tensor
    offset: int  # of the first token of its replacement in the prompt ids
    length: int  # tokens in its replacement
    placeholder_token_id: int  # the token whose positions take the image's embeddings
    model_tensors: dict[str, Tensor] = field(default_factory=dict)
    flat: bool = False  # as `Processed.flat`

    @property
    def grid_thw(self) -> tuple[int, int, int] | None:
        """The Qwen-VL families' (t, h, w) patch grid."""
        grid = self.model_tensors.get("image_grid_thw")
        if grid is None:
            return None
        t, h, w = (int(v) for v in grid.array().reshape(-1))
        return t, h, w


def decode(item: MediaItem) -> Image.Image:
    """The image as RGB, transparency composited onto white (as `transformers` converts it)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(item.data)) as opened:
            opened.load()
            if "A" in opened.getbands() or opened.info.get("transparency") is not None:
                rgba = opened.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                return Image.alpha_composite(white, rgba).convert("RGB")
            return opened.convert("RGB")
    except UnidentifiedImageError:
        # PIL's own text names the buffer object (`<_io.BytesIO object at 0x…>`): never shown.
        raise processing_failed("Failed to decode image: not a recognised image format") from None
    except Image.DecompressionBombError:
        raise processing_failed("Failed to decode image: it has too many pixels to decode") from None
    except (OSError, ValueError, SyntaxError):
        raise processing_failed("Failed to decode image: the image data is damaged or truncated") from None


def normalized(
    image: Image.Image | np.ndarray[Any, Any],
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    scale: float = 1 / 255,
) -> np.ndarray[Any, Any]:
    """The image (or its `[H, W, C]` uint8 pixels) as float32 `[C, H, W]`, rescaled and normalized
    per channel."""
    import numpy as np

    scaled = np.asarray(image, dtype=np.float32) * np.float32(scale)
    array = (scaled - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return array.transpose(2, 0, 1)


def bfloat16_bits(values: Any) -> np.ndarray[Any, Any]:
    """float32 values' bits rounded to bfloat16 (to nearest, ties to even, as torch rounds), as
    uint32: the bfloat16 in the top half, zeros below (NaN is left to the caller)."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    return (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)


@dataclass(frozen=True)
class ModelFiles:
    """A model directory's `config.json`, `preprocessor_config.json` and tokenizer vocabulary."""

    root: Path

    @classmethod
    def at(cls, model_dir: str | Path | None) -> ModelFiles:
        if model_dir is None or not Path(model_dir).is_dir():
            raise config_missing("Image inputs need the model's config: start the gateway with --model-path DIR")
        return cls(Path(model_dir))

    @cached_property
    def config(self) -> dict[str, Any]:
        return read_json(self.root / "config.json")

    @cached_property
    def preprocessor(self) -> dict[str, Any]:
        return read_json(self.root / "preprocessor_config.json")

    @property
    def model_type(self) -> str | None:
        value = self.config.get("model_type")
        return value if isinstance(value, str) else None

    def sub(self, name: str) -> dict[str, Any]:
        value = self.config.get(name)
        return value if isinstance(value, dict) else {}

    def config_id(self, *names: str) -> int:
        """The first of `names` the config (or its text config) holds as a token id."""
        for scope in (self.config, self.sub("text_config")):
            for name in names:
                value = scope.get(name)
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
        raise config_missing(f"The model's config.json has no {names[0]}")

    def token_id(self, token: str) -> int:
        """The id of `token` in the model's tokenizer."""
        found = self._vocabulary.get(token)
        if found is None:
            raise config_missing(f"The model's tokenizer has no {token!r} token")
        return found

    @cached_property
    def _vocabulary(self) -> dict[str, int]:
        raw = read_json(self.root / "tokenizer.json")
        vocab: dict[str, int] = {}
        model = raw.get("model")
        entries = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(entries, dict):
            vocab.update({k: v for k, v in entries.items() if isinstance(v, int)})
        elif isinstance(entries, list):  # Unigram: [piece, score] in id order
            vocab.update({e[0]: i for i, e in enumerate(entries) if isinstance(e, list) and e})
        for added in raw.get("added_tokens") or []:
            if isinstance(added, dict) and isinstance(added.get("content"), str) and isinstance(added.get("id"), int):
                vocab[added["content"]] = added["id"]
        return vocab


def triple(value: Any, default: tuple[float, float, float]) -> tuple[float, float, float]:
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int | float) for v in value):
        return float(value[0]), float(value[1]), float(value[2])
    return default


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise config_missing(f"Failed to read {path.name}: {exc}") from None
    return value if isinstance(value, dict) else {}
