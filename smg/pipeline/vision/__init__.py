"""Images made into what a model family's vision encoder takes, and the prompt's placeholders
expanded to match.

The gateway preprocesses (the engines run only the vision tower): an image is decoded, resized,
rescaled and normalized per the model's `preprocessor_config.json` and laid out as its family's
encoder expects, with the family's other tensors beside it. One module per family (`qwen_vl`,
`pixtral`, `gemma3`, `gemma4`, `llama4`, `phi4`), `registry` choosing one for a model directory, `prompt` expanding
the rendered prompt's placeholders.
"""

from smg.pipeline.vision.base import ImageProcessor, Processed, Tensor, VisionItem, config_missing
from smg.pipeline.vision.prompt import check_count, expand
from smg.pipeline.vision.qwen_vl import QwenVlProcessor
from smg.pipeline.vision.registry import processor_for

__all__ = [
    "ImageProcessor",
    "Processed",
    "QwenVlProcessor",
    "Tensor",
    "VisionItem",
    "check_count",
    "config_missing",
    "expand",
    "processor_for",
]
