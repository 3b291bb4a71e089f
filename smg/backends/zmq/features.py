"""A prompt's images as vLLM EngineCore's `mm_features`: one `MultiModalFeatureSpec` per image,
encoded as vLLM 0.32's `MsgpackEncoder` lays them out (`vllm/v1/serial_utils.py`).

A feature spec is a dataclass, so a msgpack map: `data` (the image's `MultiModalKwargsItem`),
`modality`, `identifier` and `mm_hash` (the gateway's content hash, hex: vLLM takes a frontend's
identifier as it takes a client's `multi_modal_uuids`, and only keys its encoder and prefix caches
by it), `mm_position` (a `PlaceholderRange` map; `is_embed` only when some of the range's tokens
take no embedding). A kwargs item maps each tensor name to a field element: `data`, the tensor as
`[dtype, shape, data]`, and `field`, `[factory, its dataclass fields]` (`flat` with the batch's
slices as `[start, stop, step]`, or `batched`). A tensor's bytes travel inline as ext type 3
below vLLM's zero-copy threshold (256 bytes), otherwise in an extra ZMQ frame after the payload
whose index the tensor names (the payload itself is frame 0).

The layout is each family's `_get_mm_fields_config` in vLLM, so a family is sent only when its
layout is known here (`sends_images`); floating tensors go in the engine's dtype, as vLLM's own
frontend casts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from smg.pipeline.vision import ImageProcessor, VisionItem
from smg.pipeline.vision.base import Tensor
from smg.pipeline.vision.qwen_vl import QwenVlProcessor

if TYPE_CHECKING:
    import numpy as np

RAW_VIEW = 3  # vLLM's CUSTOM_TYPE_RAW_VIEW
INLINE_BELOW = 256  # VLLM_MSGPACK_ZERO_COPY_THRESHOLD's default
# Tensors vLLM's field configs keep on the CPU (the Qwen-VL grid is read there to size the encoder).
KEEP_ON_CPU = frozenset({"image_grid_thw"})
# EngineCoreReadyResponse.dtype ("torch.bfloat16") -> how a float tensor is sent.
FLOAT_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32"}


def sends_images(processor: ImageProcessor) -> bool:
    """The families whose vLLM field layout this module lays out: Qwen2-VL, Qwen2.5-VL, Qwen3-VL
    (pixels flat by each image's patch count, the grid batched)."""
    return isinstance(processor, QwenVlProcessor)


@dataclass
class Frames:
    """The aux frames a message's tensors travel in (frame 0 is the payload)."""

    aux: list[bytes] = field(default_factory=list)

    def tensor(self, dtype: str, shape: tuple[int, ...], data: bytes) -> list[Any]:
        if len(data) < INLINE_BELOW:
            return [dtype, list(shape), msgpack.ExtType(RAW_VIEW, data)]
        self.aux.append(data)
        return [dtype, list(shape), len(self.aux)]


def engine_float(dtype: str) -> str:
    """The engine's dtype for floating tensors (float32 when it says nothing known)."""
    return FLOAT_DTYPES.get(dtype.removeprefix("torch."), "float32")


def _bfloat16(array: np.ndarray[Any, Any]) -> bytes:
    """float32 -> bfloat16 bytes, rounding to nearest even as torch's `.to(torch.bfloat16)`."""
    import numpy as np

    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = np.isnan(array.reshape(bits.shape))
    out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype("<u2")
    return bytes(out.tobytes())


def _encoded(frames: Frames, tensor: Tensor, float_dtype: str) -> list[Any]:
    if tensor.dtype != "float32" or float_dtype == "float32":
        return frames.tensor(tensor.dtype, tensor.shape, tensor.data)
    array = tensor.array()
    data = _bfloat16(array) if float_dtype == "bfloat16" else array.astype("<f2").tobytes()
    return frames.tensor(float_dtype, tensor.shape, data)


def _batched(key: str) -> list[Any]:
    return ["batched", {"keep_on_cpu": key in KEEP_ON_CPU}]


def mm_features(prompt_ids: list[int], images: list[VisionItem], engine_dtype: str) -> tuple[list[Any], list[bytes]]:
    """The request's `mm_features` array and the aux frames its tensors name."""
    frames = Frames()
    float_dtype = engine_float(engine_dtype)
    # Flat pixels: every item's element carries the batch's slices, as vLLM's `flat_from_sizes` builds them.
    slices: list[list[Any]] = []
    start = 0
    for image in images:
        count = image.pixel_values.shape[0]
        slices.append([start, start + count, None])
        start += count
    features: list[Any] = []
    for image in images:
        pixels_field = (
            ["flat", {"keep_on_cpu": False, "slices": slices, "dim": 0}] if image.flat else _batched("pixel_values")
        )
        item: dict[str, Any] = {
            "pixel_values": {"data": _encoded(frames, image.pixel_values, float_dtype), "field": pixels_field}
        }
        for name, tensor in sorted(image.model_tensors.items()):
            row = Tensor(shape=tensor.shape[1:], dtype=tensor.dtype, data=tensor.data)  # this image's row
            item[name] = {"data": _encoded(frames, row, float_dtype), "field": _batched(name)}
        span = prompt_ids[image.offset : image.offset + image.length]
        embeds = [t == image.placeholder_token_id for t in span]
        is_embed = None if all(embeds) else frames.tensor("bool", (len(embeds),), bytes(embeds))
        identifier = image.content_hash.hex()
        features.append(
            {
                "data": item,
                "modality": "image",
                "identifier": identifier,
                "mm_position": {"offset": image.offset, "length": image.length, "is_embed": is_embed},
                "mm_hash": identifier,
            }
        )
    return features, frames.aux
