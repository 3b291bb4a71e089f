"""A request's images as one batch, as the engines' `MultimodalInputs` carry them.

Each tensor is the images' own joined along the first dimension. A family whose pixels have no
image dimension (Qwen-VL patches, Llama 4 tiles) is sent flat: its pixels concatenated and cut
back per image by `patches_per_image`. Otherwise every image's tensors are padded to the largest
(zeros, as `transformers` pads a batch; an attention mask's padding is ones, as Phi-4's is) and
stacked, one row per image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from smg.pipeline.vision.base import Tensor, VisionItem

PIXELS = "pixel_values"
FLAT_SIZES = "patches_per_image"
MASK_PADDING = {"image_attention_mask": 1}


@dataclass(frozen=True)
class Batch:
    pixel_values: Tensor
    model_tensors: dict[str, Tensor]
    batched_keys: list[str]  # tensors with one row per image
    flat_keys: dict[str, str] = field(default_factory=dict)  # tensor -> the tensor of its per-image sizes


def batch(items: Sequence[VisionItem]) -> Batch:
    """One batch of a request's images (at least one, all of one family)."""
    import numpy as np

    names = sorted(items[0].model_tensors)
    tensors = {
        name: _stacked([i.model_tensors[name].array() for i in items], MASK_PADDING.get(name, 0)) for name in names
    }
    if items[0].flat:
        pixels = np.concatenate([i.pixel_values.array() for i in items])
        if FLAT_SIZES not in tensors:
            tensors[FLAT_SIZES] = np.asarray([i.pixel_values.shape[0] for i in items], dtype=np.int64)
        return Batch(
            pixel_values=Tensor.of(pixels),
            model_tensors={k: Tensor.of(v) for k, v in tensors.items()},
            batched_keys=sorted(tensors),
            flat_keys={PIXELS: FLAT_SIZES},
        )
    pixels = _stacked([i.pixel_values.array() for i in items], 0)
    return Batch(
        pixel_values=Tensor.of(pixels),
        model_tensors={k: Tensor.of(v) for k, v in tensors.items()},
        batched_keys=sorted([PIXELS, *tensors]),
    )


def _stacked(arrays: list[Any], fill: float) -> Any:
    import numpy as np

    widest = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    padded = [
        np.pad(a, [(0, 0), *((0, w - s) for s, w in zip(a.shape[1:], widest, strict=True))], constant_values=fill)
        for a in arrays
    ]
    return np.concatenate(padded)
