"""Each model family's image processor, value for value against `transformers`' own processor on the
same images, from model files written here: pixel values within float32 tolerance, every other
tensor equal, and each image's replacement tokens equal to the text the family's processor puts
in place of its placeholder.

`transformers` runs these without torch through its PIL image processors. Where a family's text
processor cannot be built without torch (its video processor needs torchvision), its own
`replace_image_token` runs on an instance given just the attributes that method reads; Pixtral's
processor class is unavailable without torchvision altogether, so its replacement is checked
against the published rule (marked below). Llama 4's and Phi-4's image processors run in torch
only: here their pixels are checked against the published formulas (marked below), their
replacement text by their processors' own methods; `tests/interop/test_transformers_vision.py`
checks them value for value against those torch processors.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from smg.pipeline.media import MediaItem
from smg.pipeline.vision import Processed, expand, processor_for
from smg.pipeline.vision.base import ImageProcessor
from smg.pipeline.vision.resample import resize_bilinear
from smg.protocol.errors import ApiError

SPECIALS = [
    "<unk>",
    "<|image_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
    "<|image|>",
    "<|image>",
    "<image|>",
    "<|video|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|patch|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
]
NEWLINES = "\n\n"
VOCAB = {t: i for i, t in enumerate([*SPECIALS, NEWLINES, "hi", "there"])}

# (height, width, mode): aspect ratios both ways, transparency, greyscale, palette, tiny and huge.
IMAGES = [
    (70, 100, "RGB"),
    (20, 300, "RGB"),
    (400, 90, "RGB"),
    (33, 47, "RGBA"),
    (64, 48, "L"),
    (50, 50, "P"),
    (1, 1, "RGB"),
    (1500, 2100, "RGB"),
]


def image_bytes(height: int, width: int, mode: str, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed + height * 7 + width)
    if mode == "RGBA":
        image = Image.fromarray(rng.integers(0, 255, (height, width, 4), dtype=np.uint8), "RGBA")
    elif mode == "L":
        image = Image.fromarray(rng.integers(0, 255, (height, width), dtype=np.uint8), "L")
    else:
        image = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        if mode == "P":
            image = image.quantize(16)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    raw.add_tokens([AddedToken(NEWLINES, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")


def model_dir(root: Path, config: dict[str, Any], preprocessor: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    tokenizer().save_pretrained(root)
    return root


def text_of(tokens: tuple[int, ...]) -> str:
    by_id = {i: t for t, i in VOCAB.items()}
    return "".join(by_id[t] for t in tokens)


def hf_image(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def check_tensors(ours: Processed, reference: Any, pixels: str, others: dict[str, str]) -> None:
    """`pixels` and each of `others` (ours → theirs) against a one-image `transformers` output."""
    theirs = np.asarray(reference[pixels])
    mine = ours.pixel_values.array()
    assert ours.pixel_values.dtype == "float32"
    assert mine.shape == theirs.shape
    assert np.allclose(mine, theirs, atol=1e-5)
    assert set(ours.model_tensors) == set(others)
    for name, key in others.items():
        tensor = ours.model_tensors[name]
        assert tensor.dtype == "int64"
        expected = np.asarray(reference[key], dtype=np.int64).reshape(tensor.shape)
        assert np.array_equal(tensor.array(), expected), name


def skeleton(cls: type, **attributes: Any) -> Any:
    """An instance of a `transformers` processor with only the attributes its text methods read."""
    instance = cls.__new__(cls)
    for name, value in attributes.items():
        object.__setattr__(instance, name, value)
    return instance


# --- Qwen2-VL / Qwen2.5-VL / Qwen3-VL -------------------------------------------------------------

QWEN_FAMILIES = {
    "qwen2_vl": ({"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}, None, None),
    "qwen2_5_vl": ({"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}, None, None),
    "qwen3_vl": ({"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}, [0.5] * 3, [0.5] * 3),
}


def qwen_dir(root: Path, model_type: str) -> tuple[Path, dict[str, Any]]:
    vision, mean, std = QWEN_FAMILIES[model_type]
    pre: dict[str, Any] = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": vision["patch_size"],
        "merge_size": 2,
        "temporal_patch_size": 2,
        "size": {"shortest_edge": 3136, "longest_edge": 28 * 28 * 40},
    }
    if mean:
        pre |= {"image_mean": mean, "image_std": std}
    config = {"model_type": model_type, "image_token_id": VOCAB["<|image_pad|>"], "vision_config": vision}
    return model_dir(root, config, pre), pre


@pytest.mark.parametrize("model_type", sorted(QWEN_FAMILIES))
@pytest.mark.parametrize(("height", "width", "mode"), IMAGES)
def test_qwen_vl_matches_transformers(tmp_path: Path, model_type: str, height: int, width: int, mode: str) -> None:
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor, Qwen3VLProcessor

    root, pre = qwen_dir(tmp_path, model_type)
    processor = processor_for(root)
    data = image_bytes(height, width, mode)
    ours = processor.process(MediaItem(data, "image/png"))
    hf = Qwen2VLImageProcessorPil(**{k: v for k, v in pre.items() if k != "image_processor_type"})
    reference = hf(images=[hf_image(data)], return_tensors="np")
    check_tensors(ours, reference, "pixel_values", {"image_grid_thw": "image_grid_thw"})
    text_cls = Qwen3VLProcessor if model_type == "qwen3_vl" else Qwen2VLProcessor
    text = skeleton(text_cls, image_processor=hf, image_token="<|image_pad|>")
    assert text_of(ours.tokens) == text.replace_image_token(reference, 0)
    assert ours.embed_token_id == VOCAB["<|image_pad|>"]


# --- Pixtral / Mistral 3 -------------------------------------------------------------------------


@pytest.mark.parametrize(("model_type", "patch", "merge"), [("pixtral", 16, 1), ("mistral3", 14, 2)])
@pytest.mark.parametrize(("height", "width", "mode"), IMAGES)
def test_pixtral_matches_transformers(
    tmp_path: Path, model_type: str, patch: int, merge: int, height: int, width: int, mode: str
) -> None:
    from transformers import PixtralImageProcessorPil

    pre = {
        "image_processor_type": "PixtralImageProcessor",
        "patch_size": {"height": patch, "width": patch},
        "size": {"longest_edge": 512},
    }
    config: dict[str, Any] = {
        "model_type": model_type,
        "image_token_index": VOCAB["[IMG]"],
        "vision_config": {"patch_size": patch},
    }
    if merge > 1:
        config["spatial_merge_size"] = merge
    processor = processor_for(model_dir(tmp_path, config, pre))
    data = image_bytes(height, width, mode)
    ours = processor.process(MediaItem(data, "image/png"))
    # PixtralProcessor hands its image processor patch × spatial merge, as here.
    hf = PixtralImageProcessorPil(patch_size={"height": patch * merge, "width": patch * merge}, size=pre["size"])
    reference = hf(images=[hf_image(data)], return_tensors="np")
    check_tensors(ours, reference, "pixel_values", {"image_sizes": "image_sizes"})
    # Published rule (PixtralProcessor.replace_image_token; the class needs torchvision to exist):
    # rows of [IMG] per patch column, each row ended by [IMG_BREAK], the last by [IMG_END].
    h, w = (int(v) for v in reference["image_sizes"][0])
    rows = h // (patch * merge)
    cols = w // (patch * merge)
    expected = ("[IMG]" * cols + "[IMG_BREAK]") * rows
    assert text_of(ours.tokens) == expected.removesuffix("[IMG_BREAK]") + "[IMG_END]"


# --- Gemma 3 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("height", "width", "mode"), IMAGES)
def test_gemma3_matches_transformers(tmp_path: Path, height: int, width: int, mode: str) -> None:
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor, PreTrainedTokenizerFast

    pre = {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 64, "width": 64}}
    config = {
        "model_type": "gemma3",
        "mm_tokens_per_image": 16,
        "image_token_index": VOCAB["<image_soft_token>"],
        "boi_token_index": VOCAB["<start_of_image>"],
        "eoi_token_index": VOCAB["<end_of_image>"],
    }
    root = model_dir(tmp_path, config, pre)
    processor = processor_for(root)
    data = image_bytes(height, width, mode)
    hf = Gemma3ImageProcessorPil(size=pre["size"], image_mean=[0.5] * 3, image_std=[0.5] * 3)
    fast = PreTrainedTokenizerFast.from_pretrained(
        root,
        extra_special_tokens={
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
    )
    full = Gemma3Processor(image_processor=hf, tokenizer=fast, image_seq_length=16)
    reference = full(text="hi <start_of_image> there", images=[hf_image(data)], return_tensors="np")
    ids, items = expand(fast("hi <start_of_image> there")["input_ids"], processor, [MediaItem(data, "image/png")])
    assert ids == [int(t) for t in reference["input_ids"][0]]
    ours = processor.process(MediaItem(data, "image/png"))
    check_tensors(ours, hf(images=[hf_image(data)], return_tensors="np"), "pixel_values", {"num_crops": "num_crops"})
    assert np.allclose(items[0].pixel_values.array(), reference["pixel_values"], atol=1e-5)
    assert ours.embed_token_id == VOCAB["<image_soft_token>"]


def test_gemma3_pan_and_scan_is_refused_as_not_configured(tmp_path: Path) -> None:
    config = {"model_type": "gemma3", "image_token_index": 9, "boi_token_index": 7, "eoi_token_index": 8}
    root = model_dir(tmp_path, config, {"do_pan_and_scan": True})
    with pytest.raises(ApiError) as refused:
        processor_for(root)
    assert refused.value.code == "multimodal_config_missing"


# --- Gemma 4 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [70, 280])
@pytest.mark.parametrize(("height", "width", "mode"), IMAGES)
def test_gemma4_matches_transformers(tmp_path: Path, budget: int, height: int, width: int, mode: str) -> None:
    from transformers import Gemma4ImageProcessorPil, Gemma4Processor

    pre = {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": budget}
    config = {
        "model_type": "gemma4",
        "image_token_id": VOCAB["<|image|>"],
        "boi_token_id": VOCAB["<|image>"],
        "eoi_token_id": VOCAB["<image|>"],
    }
    processor = processor_for(model_dir(tmp_path, config, pre))
    data = image_bytes(height, width, mode)
    ours = processor.process(MediaItem(data, "image/png"))
    hf = Gemma4ImageProcessorPil(max_soft_tokens=budget)
    reference = hf(images=[hf_image(data)], return_tensors="np")
    check_tensors(ours, reference, "pixel_values", {"image_position_ids": "image_position_ids"})
    text = skeleton(Gemma4Processor, boi_token="<|image>", eoi_token="<image|>", image_token="<|image|>")
    assert text_of(ours.tokens) == text.replace_image_token(reference, 0)


# --- Llama 4 (pixels: published formulas here, torch's own in tests/interop) -------------------


def llama4_dir(root: Path, pre: dict[str, Any] | None = None) -> Path:
    config = {
        "model_type": "llama4",
        "image_token_index": VOCAB["<|patch|>"],
        "vision_config": {"image_size": 56, "patch_size": 14, "pixel_shuffle_ratio": 0.5},
    }
    return model_dir(root, config, pre or {"size": {"height": 56, "width": 56}, "max_patches": 4})


def test_llama4_canvases_and_fits_are_the_published_ones(tmp_path: Path) -> None:
    from smg.pipeline.vision.llama4 import Llama4Processor

    processor = processor_for(llama4_dir(tmp_path, {"size": {"height": 224, "width": 224}, "max_patches": 4}))
    assert isinstance(processor, Llama4Processor)
    # find_supported_resolutions(max_num_chunks=4, patch_size=224), from its docstring:
    assert processor.canvases == [
        (224, 896),
        (448, 448),
        (224, 224),
        (896, 224),
        (224, 672),
        (672, 224),
        (224, 448),
        (448, 224),
    ]
    # get_max_res_without_distortion's docstring examples, as its code computes them (the code
    # floors the scaled side where the docstring shows it rounded: 133.3 -> 133, 337.5 -> 337):
    assert Llama4Processor.fit_without_distortion(200, 300, (450, 200)) == (133, 200)
    assert Llama4Processor.fit_without_distortion(800, 600, (450, 1300)) == (450, 337)
    # get_best_fit: the least upscale that fits, else the least downscale, the smaller area on a tie.
    assert processor.best_canvas(200, 300) == (224, 448)
    assert processor.best_canvas(224, 224) == (224, 224)
    assert processor.best_canvas(2000, 1000) == (448, 224)  # ties (896, 224) at 0.224, smaller


@pytest.mark.parametrize(("height", "width", "mode"), IMAGES)
def test_llama4_tiles_and_tokens(tmp_path: Path, height: int, width: int, mode: str) -> None:
    from transformers import Llama4Processor as HfLlama4Processor

    processor = processor_for(llama4_dir(tmp_path))
    data = image_bytes(height, width, mode)
    ours = processor.process(MediaItem(data, "image/png"))
    down, across = (int(v) for v in ours.model_tensors["aspect_ratios"].array()[0])
    tiles = ours.pixel_values.array()
    expected_tiles = down * across + (1 if down * across > 1 else 0)
    assert tiles.shape == (expected_tiles, 3, 56, 56)
    assert ours.model_tensors["patches_per_image"].array().tolist() == [expected_tiles]
    # Published formula: the image resized without distortion into the canvas (torchvision's
    # bilinear, checked against torchvision in test_vision_resample), padded with black (-1 once
    # normalized), normalized (x/255 - 0.5) / 0.5 in bfloat16, tiles row by row.
    image = Image.open(io.BytesIO(data)).convert("RGBA")
    white = Image.new("RGBA", image.size, (255, 255, 255, 255))
    image = Image.alpha_composite(white, image).convert("RGB")
    canvas_h, canvas_w = processor.best_canvas(image.height, image.width)  # type: ignore[attr-defined]
    assert (canvas_h // 56, canvas_w // 56) == (down, across)
    bound_h, bound_w = min(max(image.height, 56), canvas_h), min(max(image.width, 56), canvas_w)
    if bound_w / image.width < bound_h / image.height:
        new_h, new_w = min(math.floor(image.height * bound_w / image.width), bound_h), bound_w
    else:
        new_h, new_w = bound_h, min(math.floor(image.width * bound_h / image.height), bound_w)
    new_h, new_w = max(1, new_h), max(1, new_w)
    resized = resize_bilinear(np.asarray(image), new_h, new_w).astype(np.float32)
    full = np.full((canvas_h, canvas_w, 3), -1.0, dtype=np.float32)
    full[: resized.shape[0], : resized.shape[1]] = (resized / 255 - 0.5) / 0.5
    first = full[:56, :56].transpose(2, 0, 1)
    assert np.allclose(tiles[0], first, rtol=0, atol=2.0**-8)  # bfloat16's step below 1
    last = full[-56:, -56:].transpose(2, 0, 1)
    assert np.allclose(tiles[down * across - 1], last, rtol=0, atol=2.0**-8)
    assert not (tiles.view(np.uint32) & 0xFFFF).any()  # every value is a bfloat16 value
    # The text: transformers' own Llama4Processor methods, given our tensors.
    hf = skeleton(
        HfLlama4Processor,
        patch_size=14,
        downsample_ratio=4,
        start_of_img_token="<|image_start|>",
        end_of_img_token="<|image_end|>",
        img_patch_token="<|patch|>",
        tile_token="<|tile_x_separator|>",
        tile_global_token="<|tile_y_separator|>",
        fake_image_token="<|image|>",
        image_token="<|image|>",
    )
    inputs = {"pixel_values": [tiles], "aspect_ratios": ours.model_tensors["aspect_ratios"].array()}
    assert text_of(ours.tokens) == hf.replace_image_token(inputs, 0)
    assert ours.embed_token_id == VOCAB["<|patch|>"]
    assert processor.placeholder_token_id == VOCAB["<|image|>"]


# --- Phi-4 multimodal (pixels: published formulas here, torch's own in tests/interop) ----------


def phi4_dir(root: Path) -> Path:
    pre = {"size": {"height": 56, "width": 56}, "patch_size": 14, "dynamic_hd": 4}
    return model_dir(root, {"model_type": "phi4_multimodal"}, pre)


@pytest.mark.parametrize(("height", "width", "mode"), [i for i in IMAGES if min(i[0], i[1]) >= 20])
def test_phi4_crops_masks_and_tokens(tmp_path: Path, height: int, width: int, mode: str) -> None:
    from transformers import Phi4MultimodalProcessor

    processor = processor_for(phi4_dir(tmp_path))
    data = image_bytes(height, width, mode)
    ours = processor.process(MediaItem(data, "image/png"))
    across, down = processor.grid(height, width)  # type: ignore[attr-defined]
    # Published formula: the crops the sides need, or past dynamic_hd the closest grid of at most 4.
    needed = (-(-width // 56), -(-height // 56))
    assert (across, down) == needed if needed[0] * needed[1] <= 4 else across * down <= 4
    pixels = ours.pixel_values.array()
    assert pixels.shape == (1, 1 + across * down, 3, 56, 56)
    assert ours.model_tensors["image_sizes"].array().tolist() == [[56 * down, 56 * across]]
    masks = ours.model_tensors["image_attention_mask"].array()
    assert masks.shape == (1, 1 + across * down, 4, 4)
    assert masks[0, 0].all()
    # The mask is 0 exactly over whole patches of white padding; tokens count every second patch.
    scale = min(56 * across / width, 56 * down / height)
    pad_w, pad_h = 56 * across - int(width * scale), 56 * down - int(height * scale)
    grid = np.ones((4 * down, 4 * across))
    if pad_w >= 14:
        grid[:, -(pad_w // 14) :] = 0
    if pad_h >= 14:
        grid[-(pad_h // 14) :, :] = 0
    for index in range(across * down):
        row, col = divmod(index, across)
        assert np.array_equal(masks[0, 1 + index], grid[row * 4 : row * 4 + 4, col * 4 : col * 4 + 4])
    sampled = grid[0::2, 0::2]
    count = 256 + 1 + int(sampled.sum()) + int(sampled[:, 0].sum()) + 16
    assert ours.model_tensors["num_img_tokens"].array().tolist() == [count]
    hf = skeleton(Phi4MultimodalProcessor, image_token="<|image|>")
    inputs = {"num_img_tokens": [count]}
    assert text_of(ours.tokens) == hf.replace_image_token(inputs, 0)
    # The white padding, normalized, is 1.0 in every channel.
    if pad_w >= 1 and across == 1:
        assert np.allclose(pixels[0, 1, :, :, -1], 1.0)


def test_phi4_global_crop_is_pytorch_bicubic() -> None:
    from smg.pipeline.vision.phi4 import bicubic

    rng = np.random.default_rng(3)
    same = rng.random((3, 9, 7), dtype=np.float32)
    assert np.allclose(bicubic(same, 9, 7), same, atol=1e-6)  # t = 0: the kernel is (0, 1, 0, 0)
    # Cubic convolution reproduces a linear ramp away from the clamped edges (published property).
    ramp = np.tile(np.arange(40, dtype=np.float32), (1, 40, 1))
    out = bicubic(ramp, 20, 20)
    src = (np.arange(20) + 0.5) * 2 - 0.5
    assert np.allclose(out[0, 5, 2:-2], src[2:-2], atol=1e-4)
    # PyTorch's kernel at t = 0.5 with A = -0.75: (-0.09375, 0.59375, 0.59375, -0.09375).
    # Halving puts every output at t = 0.5 (source 2i + 0.5): a unit at 3 is the third tap of
    # output 1 and the first of output 2.
    step = np.zeros((1, 1, 8), dtype=np.float32)
    step[0, 0, 3] = 1.0
    assert np.allclose(bicubic(step, 1, 4)[0, 0], [0.0, 0.59375, -0.09375, 0.0], atol=1e-6)


# --- the registry and expansion ------------------------------------------------------------------


def test_a_model_type_is_found_by_its_image_processor_type(tmp_path: Path) -> None:
    config = {"model_type": "llava", "image_token_index": VOCAB["[IMG]"]}
    root = model_dir(tmp_path, config, {"image_processor_type": "PixtralImageProcessorFast"})
    assert type(processor_for(root)).__name__ == "PixtralProcessor"


def test_an_unknown_model_is_config_missing(tmp_path: Path) -> None:
    root = model_dir(tmp_path, {"model_type": "bert"}, {"image_processor_type": "ViTImageProcessor"})
    with pytest.raises(ApiError) as refused:
        processor_for(root)
    assert refused.value.code == "multimodal_config_missing"


def test_a_token_missing_from_the_tokenizer_is_config_missing(tmp_path: Path) -> None:
    root = model_dir(tmp_path, {"model_type": "pixtral", "image_token_index": 4}, {})
    (root / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"[IMG]": 4}}, "added_tokens": []}))
    with pytest.raises(ApiError) as refused:
        processor_for(root)
    assert refused.value.code == "multimodal_config_missing"


FAMILY_DIRS: dict[str, Callable[[Path], Path]] = {
    "qwen3_vl": lambda root: qwen_dir(root, "qwen3_vl")[0],
    "pixtral": lambda root: model_dir(
        root, {"model_type": "pixtral", "image_token_index": VOCAB["[IMG]"]}, {"size": {"longest_edge": 64}}
    ),
    "llama4": llama4_dir,
    "phi4": phi4_dir,
    "gemma4": lambda root: model_dir(
        root,
        {"model_type": "gemma4", "image_token_id": 10, "boi_token_id": 11, "eoi_token_id": 12},
        {"max_soft_tokens": 70},
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILY_DIRS))
def test_each_placeholder_becomes_its_images_tokens(tmp_path: Path, family: str) -> None:
    processor: ImageProcessor = processor_for(FAMILY_DIRS[family](tmp_path))
    pad = processor.placeholder_token_id
    images = [MediaItem(image_bytes(70, 100, "RGB"), "image/png"), MediaItem(image_bytes(40, 40, "L"), "image/png")]
    ids, items = expand([100, pad, 101, pad, 102], processor, images)
    first, second = (processor.process(i).tokens for i in images)
    assert ids == [100, *first, 101, *second, 102]
    assert [(i.offset, i.length) for i in items] == [(1, len(first)), (2 + len(first), len(second))]
    assert items[0].content_hash != items[1].content_hash
    with pytest.raises(ApiError) as refused:
        expand([100, pad], processor, images)
    assert refused.value.code == "multimodal_prompt_contract_mismatch"


def test_a_batch_pads_and_stacks_per_image_tensors_or_concatenates_flat_ones(tmp_path: Path) -> None:
    from smg.pipeline.vision.batch import batch

    pixtral = processor_for(FAMILY_DIRS["pixtral"](tmp_path / "pixtral"))
    images = [MediaItem(image_bytes(70, 100, "RGB"), "image/png"), MediaItem(image_bytes(40, 20, "L"), "image/png")]
    _, items = expand([pixtral.placeholder_token_id] * 2, pixtral, images)
    joined = batch(items)
    one, two = (i.pixel_values.array()[0] for i in items)
    stacked = joined.pixel_values.array()
    assert stacked.shape == (2, 3, max(one.shape[1], two.shape[1]), max(one.shape[2], two.shape[2]))
    assert np.array_equal(stacked[1, :, : two.shape[1], : two.shape[2]], two)
    assert not stacked[1, :, two.shape[1] :, :].any() and not stacked[1, :, :, two.shape[2] :].any()
    assert joined.model_tensors["image_sizes"].array().tolist() == [list(one.shape[1:]), list(two.shape[1:])]
    assert joined.batched_keys == ["image_sizes", "pixel_values"] and joined.flat_keys == {}

    phi4 = processor_for(FAMILY_DIRS["phi4"](tmp_path / "phi4"))
    wide = [MediaItem(image_bytes(50, 150, "RGB"), "image/png"), MediaItem(image_bytes(40, 40, "RGB"), "image/png")]
    _, items = expand([phi4.placeholder_token_id] * 2, phi4, wide)
    joined = batch(items)
    masks = joined.model_tensors["image_attention_mask"].array()
    assert joined.pixel_values.shape[:2] == (2, 4) and masks.shape[:2] == (2, 4)
    assert masks[1, 2:].all() and not joined.pixel_values.array()[1, 2:].any()  # mask pads with ones

    qwen = processor_for(FAMILY_DIRS["qwen3_vl"](tmp_path / "qwen"))
    _, items = expand([qwen.placeholder_token_id] * 2, qwen, images)
    joined = batch(items)
    patches = [i.pixel_values.shape[0] for i in items]
    assert joined.pixel_values.shape[0] == sum(patches)
    assert joined.model_tensors["patches_per_image"].array().tolist() == patches
    assert joined.model_tensors["image_grid_thw"].shape == (2, 3)
    assert joined.flat_keys == {"pixel_values": "patches_per_image"}


@pytest.mark.parametrize(("family", "most"), [("qwen3_vl", 10), ("llama4", 8), ("pixtral", None)])
def test_each_family_takes_at_most_the_reference_gateways_images(tmp_path: Path, family: str, most: int | None) -> None:
    from smg.pipeline.vision import check_count

    processor = processor_for(FAMILY_DIRS[family](tmp_path))
    assert processor.max_images == most
    check_count(processor, most or 100)
    if most is not None:
        with pytest.raises(ApiError) as refused:
            check_count(processor, most + 1)
        assert refused.value.code == "invalid_multimodal_request"
