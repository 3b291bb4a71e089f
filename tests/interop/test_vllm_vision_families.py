"""The ZMQ image layout of each family beyond Qwen-VL, proven against vLLM 0.32 itself without an
engine (no tiny models exist for these families): the gateway's ADD frames decoded by vLLM's own
`MsgpackDecoder(EngineCoreRequest)`, then compared item by item with what vLLM's own field config
for that model (its processor's `_get_mm_fields_config`) builds from `transformers`' processor
output on the same images, as vLLM's processor renames and post-processes it; and batched by
vLLM's field classes as the engine batches them.

Opt-in: ``SMG_VLLM_PYTHON`` names a vLLM CPU venv's python (``make test-vllm`` sets it); without
it every test is skipped. Pixel values are compared within bfloat16 rounding, except Llama 4's:
`transformers` resizes those with torchvision's antialiased bilinear and normalizes in bfloat16,
where the gateway uses PIL's bilinear (as the reference gateway does), so only their layout,
shapes and dtypes are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from smg.backends.zmq import features, wire
from smg.pipeline.media import MediaItem
from smg.pipeline.vision import expand, processor_for
from tests.grpc.test_images import TALL, WIDE
from tests.zmq.test_images import FAMILIES, family_dir

PYTHON_ENV = "SMG_VLLM_PYTHON"

pytestmark = pytest.mark.skipif(
    not os.environ.get(PYTHON_ENV),
    reason=f"vLLM interop test, opt-in: run `make test-vllm` (it sets {PYTHON_ENV})",
)

# Run in the vLLM venv: argv = family, frames dir, images dir, model dir.
CHECK = """
import json, sys
from pathlib import Path
import torch
from PIL import Image
from transformers import BatchFeature
from vllm.multimodal.inputs import MultiModalFlatField, MultiModalKwargsItems
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.serial_utils import MsgpackDecoder

family, frames_dir, images_dir, model_dir = sys.argv[1:5]
pre = json.loads((Path(model_dir) / "preprocessor_config.json").read_text())
config = json.loads((Path(model_dir) / "config.json").read_text())
frames = [p.read_bytes() for p in sorted(Path(frames_dir).iterdir())]
request = MsgpackDecoder(EngineCoreRequest).decode(frames)
images = [Image.open(p) for p in sorted(Path(images_dir).iterdir())]

# transformers' processor output as vLLM's processor for the model hands it on.
if family == "gemma3":
    from transformers import Gemma3ImageProcessorPil
    from vllm.model_executor.models.gemma3_mm import Gemma3MultiModalProcessor as Processor
    out = Gemma3ImageProcessorPil(size=pre["size"], image_mean=[0.5] * 3, image_std=[0.5] * 3)(
        images=images, return_tensors="pt")
    hf = {"pixel_values": out["pixel_values"], "num_patches": torch.as_tensor(out["num_crops"]) + 1}
elif family == "gemma4":
    from transformers import Gemma4ImageProcessorPil
    from vllm.model_executor.models.gemma4_mm import Gemma4MultiModalProcessor as Processor
    out = Gemma4ImageProcessorPil(max_soft_tokens=pre["max_soft_tokens"], patch_size=pre["patch_size"])(
        images=images, return_tensors="pt")
    hf = {"pixel_values": out["pixel_values"], "pixel_position_ids": out["image_position_ids"]}
elif family == "mistral3":
    from transformers import PixtralImageProcessorPil
    from vllm.model_executor.models.mistral3 import Mistral3MultiModalProcessor as Processor
    patch = pre["patch_size"]["height"] * config["spatial_merge_size"]
    out = PixtralImageProcessorPil(patch_size={"height": patch, "width": patch}, size=pre["size"])(
        images=images, return_tensors="pt")
    hf = {"pixel_values": [p[:, :h, :w] for p, (h, w) in zip(out["pixel_values"], out["image_sizes"].tolist())],
          "image_sizes": out["image_sizes"]}
elif family == "llama4":
    from transformers.models.llama4.image_processing_llama4 import Llama4ImageProcessor
    from vllm.model_executor.models.mllama4 import Mllama4MultiModalProcessor as Processor
    out = Llama4ImageProcessor(size=pre["size"], max_patches=pre["max_patches"])(images=images, return_tensors="pt")
    ratios = [tuple(int(v) for v in r) for r in out["aspect_ratios"]]
    hf = {"pixel_values": out["pixel_values"], "aspect_ratios": torch.tensor(ratios),
          "patches_per_image": torch.tensor([1 if h * w == 1 else 1 + h * w for h, w in ratios])}
else:
    raise SystemExit(f"unknown family {family}")

def bounds(slices):
    out = []
    for s in slices:
        (s,) = s if isinstance(s, (list, tuple)) else (s,)
        out.append((int(s.start), int(s.stop), s.step))
    return out


inputs = BatchFeature(hf)
field_config = Processor._get_mm_fields_config(None, inputs, {})
expected = MultiModalKwargsItems.from_hf_inputs(inputs, field_config)["image"]
got = [f.data for f in request.mm_features]
assert len(got) == len(expected) == 2, (len(got), len(expected))
report = {"keys": sorted(got[0]), "items": []}
for ours, theirs in zip(got, expected):
    assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
    described = {}
    for key in theirs:
        a, b = ours[key], theirs[key]
        assert type(a.field) is type(b.field), (key, a.field, b.field)
        assert a.field.keep_on_cpu == b.field.keep_on_cpu, (key, a.field, b.field)
        if isinstance(b.field, MultiModalFlatField):
            # vLLM's own frontend sends each item's slice as a one-slice index tuple (dim 0): the same rows.
            assert bounds(a.field.slices) == bounds(b.field.slices), (key, a.field, b.field)
            assert a.field.dim == b.field.dim, (key, a.field, b.field)
        want = b.data.to(torch.bfloat16) if b.data.is_floating_point() else b.data
        assert a.data.dtype == want.dtype and a.data.shape == want.shape, (key, a.data.dtype, a.data.shape, want.shape)
        if not b.data.is_floating_point():
            assert torch.equal(a.data, b.data), key
        elif family != "llama4":
            assert torch.allclose(a.data.float(), b.data.float(), rtol=2.0**-7, atol=1e-5), key
        described[key] = {"field": type(a.field).__name__, "dtype": str(a.data.dtype), "shape": list(a.data.shape)}
    report["items"].append(described)
# Batched as the engine batches a request's items.
batched = MultiModalKwargsItems({"image": got}).get_data()
reference = MultiModalKwargsItems({"image": list(expected)}).get_data()
shape = lambda v: [list(t.shape) for t in v] if isinstance(v, (list, tuple)) else list(v.shape)
report["batched"] = {k: shape(v) for k, v in batched.items()}
assert report["batched"] == {k: shape(v) for k, v in reference.items()}, (report["batched"], reference.keys())
print(json.dumps(report))
"""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_vllms_field_config_builds_what_the_gateway_sends(family: str, tmp_path: Path) -> None:
    model = family_dir(tmp_path / "model", family, FAMILIES[family])
    processor = processor_for(model)
    pad = processor.placeholder_token_id
    ids, items = expand([1, pad, 5, pad, 7], processor, [MediaItem(d, "image/png") for d in (WIDE, TALL)])
    mm, aux = features.mm_features(ids, items, "torch.bfloat16")
    frames, images = tmp_path / "frames", tmp_path / "images"
    frames.mkdir()
    images.mkdir()
    for i, frame in enumerate([wire.add_request("req-1", ids, {"max_tokens": 4}, mm), *aux]):
        (frames / f"{i:03d}").write_bytes(frame)
    for i, data in enumerate((WIDE, TALL)):
        (images / f"{i}.png").write_bytes(data)
    command = [os.environ[PYTHON_ENV], "-c", CHECK, family, str(frames), str(images), str(model)]
    done = subprocess.run(command, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report["keys"] == sorted(FAMILIES[family].fields)
    for item in report["items"]:
        for key, (kind, _) in FAMILIES[family].fields.items():
            assert item[key]["field"] == ("MultiModalFlatField" if kind == "flat" else "MultiModalBatchedField")
