"""The gateway's uint8 resize against torchvision's antialiased bilinear `resize`, the one
`transformers`' torch image processors (Llama 4, Phi-4 multimodal) use.

`tests/fixtures/torchvision_resize.npz` holds a 9×13 RGB image and torchvision 0.28's outputs for
it at several sizes (down, up, and down one way while up the other), made in the vLLM venv with
`tvF.resize(torch.from_numpy(src).permute(2, 0, 1), [h, w], antialias=True)`. PIL's bilinear,
which keeps 22 bits of weight precision where torchvision keeps int16 weights, misses some of them
by one level.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from smg.pipeline.vision.resample import _weights, resize_bilinear

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "torchvision_resize.npz"


def test_every_size_is_torchvisions_value_for_value() -> None:
    saved = np.load(FIXTURE)
    source = saved["source"]
    pil_differs = 0
    for key in saved.files:
        if key == "source":
            continue
        height, width = (int(v) for v in key.split("x"))
        assert np.array_equal(resize_bilinear(source, height, width), saved[key]), key
        pil = np.asarray(Image.fromarray(source).resize((width, height), Image.Resampling.BILINEAR))
        pil_differs += int((pil != saved[key]).sum())
    assert pil_differs > 0  # the sizes include ones where PIL's result is not torchvision's


def test_the_same_size_is_unchanged() -> None:
    source = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(resize_bilinear(source, 5, 7), source)


def test_halving_weighs_four_taps_and_quantizes_to_int16() -> None:
    # Scale 2: the triangle widened to support 2 puts (1, 3, 3, 1) / 8 on the four nearest inputs
    # (clamped at the edges and renormalized); the largest weight 0.375 sets 2^16 · 0.375 >= 2^15,
    # so the precision is 16 bits.
    index, weights, precision = _weights(8, 4)
    assert precision == 16
    assert index[1, :4].tolist() == [1, 2, 3, 4]
    assert weights[1, :4].tolist() == [8192, 24576, 24576, 8192]
    # At the edge only three inputs are in reach: (3, 3, 1) / 7, rounded half away from zero.
    assert index[0, :3].tolist() == [0, 1, 2]
    assert weights[0, :3].tolist() == [round(65536 * 3 / 7), round(65536 * 3 / 7), round(65536 / 7)]
