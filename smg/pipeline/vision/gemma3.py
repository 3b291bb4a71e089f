"""The Gemma 3 image processor (`model_type` `gemma3`, `transformers`' `Gemma3ImageProcessor`).

The image is resized to the fixed `size` (896 × 896), bilinear, rescaled and normalized (0.5, 0.5);
`pixel_values` `[1, 3, H, W]` float32 and `num_crops` `[1]` int64 (0: pan-and-scan is not applied,
and a model asking for it is refused as not configured). The template renders one
`<start_of_image>`; it becomes `\\n\\n<start_of_image>` + `mm_tokens_per_image` ×
`<image_soft_token>` + `<end_of_image>\\n\\n`, the two newlines as the tokenizer's one `\\n\\n` token.
The expansion is in ids: `transformers` expands the text and tokenizes it, so where the template
puts a newline right beside the placeholder its tokenizer may join them into one longer newline
token that this expansion keeps as two.
"""

from __future__ import annotations

from dataclasses import dataclass

from smg.pipeline.media import MediaItem
from smg.pipeline.vision.base import HALF, ModelFiles, Processed, Tensor, config_missing, decode, normalized, triple


@dataclass(frozen=True)
class Gemma3Processor:
    boi_token_id: int
    eoi_token_id: int
    image_token_id: int
    newlines_token_id: int
    tokens_per_image: int = 256
    height: int = 896
    width: int = 896
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF

    @classmethod
    def from_files(cls, files: ModelFiles) -> Gemma3Processor:
        pre = files.preprocessor
        if pre.get("do_pan_and_scan"):
            raise config_missing("Gemma 3 pan-and-scan is not supported: set do_pan_and_scan false")
        size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
        return cls(
            boi_token_id=files.config_id("boi_token_index", "boi_token_id"),
            eoi_token_id=files.config_id("eoi_token_index", "eoi_token_id"),
            image_token_id=files.config_id("image_token_index", "image_token_id"),
            newlines_token_id=files.token_id("\n\n"),
            tokens_per_image=int(files.config.get("mm_tokens_per_image") or 256),
            height=int((size or {}).get("height") or 896),
            width=int((size or {}).get("width") or 896),
            mean=triple(pre.get("image_mean"), HALF),
            std=triple(pre.get("image_std"), HALF),
        )

    @property
    def max_images(self) -> int | None:
        return None  # the reference gateway names no limit for this family: `--media-max-items` only

    @property
    def placeholder_token_id(self) -> int:
        return self.boi_token_id

    def process(self, item: MediaItem) -> Processed:
        import numpy as np
        from PIL import Image

        image = decode(item).resize((self.width, self.height), Image.Resampling.BILINEAR)
        return Processed(
            pixel_values=Tensor.of(normalized(image, self.mean, self.std)[None]),
            model_tensors={"num_crops": Tensor.of(np.zeros(1, dtype=np.int64))},
            tokens=(
                self.newlines_token_id,
                self.boi_token_id,
                *(self.image_token_id,) * self.tokens_per_image,
                self.eoi_token_id,
                self.newlines_token_id,
            ),
            embed_token_id=self.image_token_id,
        )
