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

The layout is each family's `_get_mm_fields_config` in vLLM 0.32 (`LAYOUTS`), with the names and
shapes vLLM's own processor gives that model, so a family is sent only when its layout is known
here (`sends_images`); a tensor vLLM's config does not name is not sent, and floating tensors go
in the engine's dtype, as vLLM's own frontend casts them. Phi-4 multimodal is not laid out: vLLM
0.32 serves only the remote-code `Phi4MMForCausalLM` checkpoint, whose processor neither vLLM nor
`transformers` ships to check its tensors against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from smg.pipeline.vision import ImageProcessor, VisionItem
from smg.pipeline.vision.base import Tensor, bfloat16_bits
from smg.pipeline.vision.gemma3 import Gemma3Processor
from smg.pipeline.vision.gemma4 import Gemma4Processor
from smg.pipeline.vision.llama4 import Llama4Processor
from smg.pipeline.vision.pixtral import PixtralProcessor
from smg.pipeline.vision.qwen_vl import QwenVlProcessor

if TYPE_CHECKING:
    import numpy as np

RAW_VIEW = 3  # vLLM's CUSTOM_TYPE_RAW_VIEW
INLINE_BELOW = 256  # VLLM_MSGPACK_ZERO_COPY_THRESHOLD's default
# EngineCoreReadyResponse.dtype ("torch.bfloat16") -> how a float tensor is sent.
FLOAT_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32"}


@dataclass(frozen=True)
class Field:
    """How one of the gateway's per-image tensors travels: vLLM's name for it, always `batched`."""

    name: str
    keep_on_cpu: bool = False
    plus: int = 0  # added to every value: Gemma 3's `num_patches` is its `num_crops` + 1


@dataclass(frozen=True)
class Layout:
    """A family's vLLM field config. `flat`: the pixels are `flat_from_sizes` by their first
    dimension (the image's own tensor sent whole); otherwise `batched`, the image's row sent.
    `fields` maps each of the gateway's tensors vLLM takes to its field; the others are not sent."""

    flat: bool
    fields: dict[str, Field]
    pixels: str = "pixel_values"


LAYOUTS: dict[type, Layout] = {
    # qwen2_vl.py / qwen2_5_vl.py / qwen3_vl.py: patches flat, the grid read on the CPU to size the encoder.
    QwenVlProcessor: Layout(flat=True, fields={"image_grid_thw": Field("image_grid_thw", keep_on_cpu=True)}),
    # llava.py (PixtralHF) / mistral3.py: each image's [3, H, W] unpadded, batched; image_sizes not kept.
    # (An engine loading the checkpoint in Mistral's own format, pixtral.py, names these `images`.)
    PixtralProcessor: Layout(flat=False, fields={}),
    # gemma3_mm.py: crops flat by num_patches (the image and its pan-and-scan crops), counted on the CPU.
    Gemma3Processor: Layout(flat=True, fields={"num_crops": Field("num_patches", keep_on_cpu=True, plus=1)}),
    # gemma4_mm.py: padded patches batched, their positions renamed as vLLM's processor renames them.
    Gemma4Processor: Layout(flat=False, fields={"image_position_ids": Field("pixel_position_ids")}),
    # mllama4.py: tiles flat by patches_per_image; both counts read on the CPU.
    Llama4Processor: Layout(
        flat=True,
        fields={
            "aspect_ratios": Field("aspect_ratios", keep_on_cpu=True),
            "patches_per_image": Field("patches_per_image", keep_on_cpu=True),
        },
    ),
}
# A request's images are all of the one family its model has: the names of its tensors say which.
_BY_TENSORS = {
    frozenset({"image_grid_thw"}): LAYOUTS[QwenVlProcessor],
    frozenset({"image_sizes"}): LAYOUTS[PixtralProcessor],
    frozenset({"num_crops"}): LAYOUTS[Gemma3Processor],
    frozenset({"image_position_ids"}): LAYOUTS[Gemma4Processor],
    frozenset({"aspect_ratios", "patches_per_image"}): LAYOUTS[Llama4Processor],
}


def sends_images(processor: ImageProcessor) -> bool:
    """The families whose vLLM field layout this module lays out (`LAYOUTS`)."""
    return type(processor) in LAYOUTS


def layout_of(image: VisionItem) -> Layout:
    """The layout of the family that processed `image` (one `sends_images` passed)."""
    layout = _BY_TENSORS.get(frozenset(image.model_tensors))
    if layout is None:
        raise ValueError(f"no vLLM layout for an image with tensors {sorted(image.model_tensors)}")
    return layout


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
    rounded = bfloat16_bits(array) >> np.uint32(16)
    nan = np.isnan(array.reshape(bits.shape))
    out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype("<u2")
    return bytes(out.tobytes())


def _encoded(frames: Frames, tensor: Tensor, float_dtype: str) -> list[Any]:
    if tensor.dtype != "float32" or float_dtype == "float32":
        return frames.tensor(tensor.dtype, tensor.shape, tensor.data)
    array = tensor.array()
    data = _bfloat16(array) if float_dtype == "bfloat16" else array.astype("<f2").tobytes()
    return frames.tensor(float_dtype, tensor.shape, data)


def _batched(keep_on_cpu: bool = False) -> list[Any]:
    return ["batched", {"keep_on_cpu": keep_on_cpu}]


def _row(tensor: Tensor, plus: int = 0) -> Tensor:
    """One image's row of a tensor that has an image dimension of one."""
    data = tensor.data if not plus else Tensor.of(tensor.array() + plus).data
    return Tensor(shape=tensor.shape[1:], dtype=tensor.dtype, data=data)


def mm_features(prompt_ids: list[int], images: list[VisionItem], engine_dtype: str) -> tuple[list[Any], list[bytes]]:
    """The request's `mm_features` array and the aux frames its tensors name."""
    frames = Frames()
    float_dtype = engine_float(engine_dtype)
    layout = layout_of(images[0])
    # Flat pixels: every item's element carries the batch's slices, as vLLM's `flat_from_sizes` builds them.
    slices: list[list[Any]] = []
    start = 0
    for image in images:
        count = image.pixel_values.shape[0]
        slices.append([start, start + count, None])
        start += count
    pixels_field = ["flat", {"keep_on_cpu": False, "slices": slices, "dim": 0}] if layout.flat else _batched()
    features: list[Any] = []
    for image in images:
        pixels = image.pixel_values if layout.flat else _row(image.pixel_values)
        item: dict[str, Any] = {layout.pixels: {"data": _encoded(frames, pixels, float_dtype), "field": pixels_field}}
        for name, tensor in sorted(image.model_tensors.items()):
            sent = layout.fields.get(name)
            if sent is not None:
                data = _encoded(frames, _row(tensor, sent.plus), float_dtype)
                item[sent.name] = {"data": data, "field": _batched(sent.keep_on_cpu)}
        span = prompt_ids[image.offset : image.offset + image.length]
        embeds = [t == image.placeholder_token_id for t in span]
        is_embed = None if all(embeds) else frames.tensor("bool", (len(embeds),), bytes(embeds))
        identifier = image.content_hash.hex()
        features.append(
            {
                "data": dict(sorted(item.items())),
                "modality": "image",
                "identifier": identifier,
                "mm_position": {"offset": image.offset, "length": image.length, "is_embed": is_embed},
                "mm_hash": identifier,
            }
        )
    return features, frames.aux
