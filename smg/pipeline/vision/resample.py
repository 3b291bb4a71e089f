"""Image resizing as torchvision resizes a uint8 image: antialiased bilinear in fixed point.

`transformers`' torch image processors (Llama 4, Phi-4 multimodal) resize the decoded uint8 image
with torchvision, whose CPU kernel is PIL's separable convolution (the triangle filter widened by
the downscale factor, horizontal pass first, rounded to uint8 between passes) with its weights
quantized to int16 at the finest precision that keeps the largest weight below 2¹⁵, where PIL
keeps 22 bits: PIL's result can differ from it by one level, so the weights are computed here.
"""

from __future__ import annotations

import math
from typing import Any

MAX_PRECISION = 22


def resize_bilinear(pixels: Any, height: int, width: int) -> Any:
    """`[H, W, C]` uint8 resized to `[height, width, C]` uint8, as torchvision's antialiased
    bilinear `resize` of a uint8 image on the CPU."""
    if pixels.shape[1] != width:
        pixels = _pass(pixels, width, axis=1)
    if pixels.shape[0] != height:
        pixels = _pass(pixels, height, axis=0)
    return pixels


def _pass(pixels: Any, size_out: int, axis: int) -> Any:
    import numpy as np

    index, weights, precision = _weights(pixels.shape[axis], size_out)
    shape = [1, 1, 1]
    shape[axis] = size_out
    acc = np.full(
        tuple(s if i == axis else pixels.shape[i] for i, s in enumerate(shape)), 1 << (precision - 1), dtype=np.int32
    )
    for tap in range(index.shape[1]):
        acc += np.take(pixels, index[:, tap], axis=axis).astype(np.int32) * weights[:, tap].reshape(shape)
    return np.clip(acc >> precision, 0, 255).astype(np.uint8)


def _weights(size_in: int, size_out: int) -> tuple[Any, Any, int]:
    """Each output's source indices `[out, taps]`, int16-quantized weights and their precision."""
    import numpy as np

    scale = size_in / size_out
    support = scale if scale >= 1.0 else 1.0
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    taps = math.ceil(support) * 2 + 1
    index = np.zeros((size_out, taps), dtype=np.int64)
    weights = np.zeros((size_out, taps), dtype=np.float64)
    for i in range(size_out):
        center = scale * (i + 0.5)
        first = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), size_in) - first
        w = np.maximum(0.0, 1.0 - np.abs((np.arange(count) + first - center + 0.5) * inverse))
        total = w.sum()
        weights[i, :count] = w / total if total != 0 else w
        index[i, :count] = np.arange(first, first + count)
        index[i, count:] = first  # weight 0
    largest = float(weights.max())
    precision = 0
    while precision < MAX_PRECISION and int(0.5 + largest * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    quantized = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    return index, quantized, precision
