"""A rendered prompt's image placeholders replaced by each image's tokens, one for one.

The chat template renders one placeholder token per image; each is replaced by what the family's
processor puts in the text for that image (repeated soft tokens, wrapped in start/end tokens or
broken into rows where the family does so). A prompt whose placeholders do not match the images
one for one is 400 `multimodal_prompt_contract_mismatch`; more images than the family takes, 400
`invalid_multimodal_request`.
"""

from __future__ import annotations

from smg.pipeline.media import MediaItem
from smg.pipeline.vision.base import ImageProcessor, VisionItem
from smg.protocol.errors import ApiError


def check_count(processor: ImageProcessor, count: int, limit: int | None = None) -> None:
    """Refuse more images than the family takes (`limit`, when set, instead of the family's own:
    `--mm-per-request-image-limit` / `SMG_IMAGE_MAX_COUNT`), before any is fetched (400
    `invalid_multimodal_request`)."""
    most = limit if limit is not None else processor.max_images
    if most is not None and count > most:
        raise ApiError(
            400,
            f"invalid media request: this model supports at most {most} image inputs; got {count}",
            code="invalid_multimodal_request",
        )


def expand(ids: list[int], processor: ImageProcessor, images: list[MediaItem]) -> tuple[list[int], list[VisionItem]]:
    """The prompt ids with each image's placeholder expanded to its tokens, and the images' items."""
    token = processor.placeholder_token_id
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
        processed = processor.process(image)
        items.append(
            VisionItem(
                content_hash=image.content_hash,
                pixel_values=processed.pixel_values,
                offset=len(out),
                length=len(processed.tokens),
                placeholder_token_id=processed.embed_token_id,
                model_tensors=processed.model_tensors,
                flat=processed.flat,
            )
        )
        out.extend(processed.tokens)
        start = position + 1
    out.extend(ids[start:])
    return out, items
