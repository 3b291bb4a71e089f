"""Which image processor a model takes: by its `config.json` `model_type`, else by its
`preprocessor_config.json` `image_processor_type`.

A model neither names is 400 `multimodal_config_missing`, as is one whose files lack a token id
its processor needs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from smg.pipeline.vision.base import ImageProcessor, ModelFiles, config_missing
from smg.pipeline.vision.gemma3 import Gemma3Processor
from smg.pipeline.vision.gemma4 import Gemma4Processor
from smg.pipeline.vision.llama4 import Llama4Processor
from smg.pipeline.vision.phi4 import Phi4Processor
from smg.pipeline.vision.pixtral import PixtralProcessor
from smg.pipeline.vision.qwen_vl import QWEN_VL_TYPES, QwenVlProcessor

Factory = Callable[[ModelFiles], ImageProcessor]

BY_MODEL_TYPE: dict[str, Factory] = {
    **dict.fromkeys(QWEN_VL_TYPES, QwenVlProcessor.from_files),
    "pixtral": PixtralProcessor.from_files,
    "mistral3": PixtralProcessor.from_files,
    "gemma3": Gemma3Processor.from_files,
    "gemma4": Gemma4Processor.from_files,
    "llama4": Llama4Processor.from_files,
    "phi4_multimodal": Phi4Processor.from_files,
    "phi4mm": Phi4Processor.from_files,
}

BY_IMAGE_PROCESSOR: dict[str, Factory] = {
    "Qwen2VLImageProcessor": QwenVlProcessor.from_files,
    "PixtralImageProcessor": PixtralProcessor.from_files,
    "Gemma3ImageProcessor": Gemma3Processor.from_files,
    "Gemma4ImageProcessor": Gemma4Processor.from_files,
    "Llama4ImageProcessor": Llama4Processor.from_files,
    "Phi4MultimodalImageProcessor": Phi4Processor.from_files,
}


def processor_for(model_dir: str | Path | None) -> ImageProcessor:
    """The image processor of the model in `model_dir`, its settings read from there."""
    files = ModelFiles.at(model_dir)
    factory = BY_MODEL_TYPE.get(files.model_type or "")
    if factory is None:
        named = files.preprocessor.get("image_processor_type")
        if isinstance(named, str):
            factory = BY_IMAGE_PROCESSOR.get(named.removesuffix("Fast").removesuffix("Pil"))
    if factory is None:
        raise config_missing(
            f"No image processor for model type {files.model_type!r} (known: {', '.join(sorted(BY_MODEL_TYPE))})"
        )
    return factory(files)
