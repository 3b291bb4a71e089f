"""`transformers`' own Llama 4 and Phi-4 multimodal processors on a list of images, their outputs
dumped as `.npz` files: the reference the gateway's image processors are compared with.

Run in a venv with torch, torchvision and `transformers` (the vLLM venv); it imports nothing of
smg. Each job names a model directory (`preprocessor_config.json` and `tokenizer.json`, written
locally, never fetched), an image file and a text holding one `<|image|>`; its output holds every
tensor the image processor returns (bfloat16 widened to float32, which is exact) and the
`input_ids` the family's processor makes of the text and the image.

An image with transparency is composited onto white first, as `transformers` 5.24 and later do
in their own RGB conversion; 5.19 (the vLLM venv's pin) drops the alpha instead.

    python tools/vision_reference.py JOBS.json OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def as_numpy(value: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return value.to(torch.float32).numpy()
        return value.to(torch.int64).numpy()
    return np.asarray(value)


def processor(family: str, model_dir: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"), unk_token="<unk>")
    if family == "llama4":
        from transformers import Llama4ImageProcessor, Llama4Processor

        config = json.loads((model_dir / "config.json").read_text())["vision_config"]
        return Llama4Processor(
            image_processor=Llama4ImageProcessor.from_pretrained(model_dir),
            tokenizer=tokenizer,
            patch_size=config["patch_size"],
            pixel_shuffle_ratio=config["pixel_shuffle_ratio"],
        )
    if family == "phi4":
        from transformers import Phi4MultimodalFeatureExtractor, Phi4MultimodalImageProcessor, Phi4MultimodalProcessor

        # The processor reads its image and audio tokens from the tokenizer.
        tokenizer.image_token, tokenizer.audio_token = "<|image|>", "<|audio|>"
        tokenizer.image_token_id = tokenizer.convert_tokens_to_ids("<|image|>")
        tokenizer.audio_token_id = tokenizer.convert_tokens_to_ids("<|audio|>")
        return Phi4MultimodalProcessor(
            image_processor=Phi4MultimodalImageProcessor.from_pretrained(model_dir),
            audio_processor=Phi4MultimodalFeatureExtractor(),
            tokenizer=tokenizer,
        )
    raise SystemExit(f"unknown family {family!r}")


def opened(path: str) -> Any:
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        if "A" not in image.getbands() and image.info.get("transparency") is None:
            return image
        rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def main() -> None:
    import numpy as np

    jobs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    made: dict[tuple[str, str], Any] = {}
    for job in jobs:
        key = (job["family"], job["model_dir"])
        if key not in made:
            made[key] = processor(job["family"], Path(job["model_dir"]))
        hf = made[key]
        image = opened(job["image"])
        tensors = hf.image_processor(images=[image], return_tensors="pt")
        ids = hf(text=[job["text"]], images=[image], return_tensors="pt")["input_ids"]
        arrays = {name: as_numpy(value) for name, value in tensors.items()}
        arrays["input_ids"] = as_numpy(ids)
        np.savez(out / f"{job['id']}.npz", **arrays)
    print(json.dumps({"jobs": len(jobs)}))


if __name__ == "__main__":
    main()
