"""Lets PyPI's torchvision run its Python transforms next to the CPU torch of the vLLM venv.

PyPI's torchvision wheels are CUDA builds: their compiled ops (`_C.so`: nms, roi_align, the
detection kernels) link libtorch_cuda and are not loaded beside a `+cpu` torch, and then
`torchvision._meta_registrations` fails registering fake kernels for `nms` and `qnms`, the two
it registers without checking the ops loaded. Declaring those two schemas first is all it
takes: the transforms vLLM's and transformers' image processors use are plain torch. Imported
at interpreter start by `smg_torchvision_ops.pth` (installed by the Makefile's vLLM recipe).
"""

import torch

for _name in ("nms", "qnms"):
    try:
        torch.library.define(f"torchvision::{_name}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:
        pass  # already declared (a torchvision whose ops did load)
