"""gpu_ops: batched image augmentation kernels (C++ on CPU, CUDA on GPU) for data pipelines.

Ops take per-sample parameters as tensors and dispatch through the PyTorch dispatcher on the
input's device::

    import torch, gpu_ops
    imgs = torch.randint(0, 256, (8, 240, 320, 3), dtype=torch.uint8)       # decoder output, NHWC
    params = gpu_ops.RandomResizedCrop(224).generate_parameters(8, 240, 320)
    x = gpu_ops.resized_crop_mirror_normalize(imgs, params.boxes, 224,
                                              [123.7, 116.3, 103.5], [58.4, 57.1, 57.4],
                                              flip=params.flip)               # [8, 3, 224, 224]

See docs/gpu.md ("gpu_ops: fused augmentation kernels") for semantics, the build and the benchmark.
"""

from gpu_ops.ops import (
    EXTENSION_ERROR,
    EXTENSION_LOADED,
    adjust_color,
    crop_mirror_normalize,
    invert_affine,
    resize,
    resized_crop_mirror_normalize,
    warp_affine,
)
from gpu_ops.ragged import RaggedBatch
from gpu_ops.random import RandomColorJitter, RandomResizedCrop

__all__ = [
    "warp_affine",
    "invert_affine",
    "resize",
    "crop_mirror_normalize",
    "resized_crop_mirror_normalize",
    "adjust_color",
    "RandomResizedCrop",
    "RandomColorJitter",
    "RaggedBatch",
    "EXTENSION_LOADED",
    "EXTENSION_ERROR",
]
