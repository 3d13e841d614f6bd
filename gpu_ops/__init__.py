"""gpu_ops: packer's native code for data pipelines, in three parts behind one package.

* **Augmentation kernels** (``csrc/cpu/<op>.cpp`` on the CPU, ``csrc/cuda/<op>.cu`` on the GPU,
  dispatched by the input's device; typed wrappers in :mod:`gpu_ops.ops`, a pure-torch reference in
  ``_reference.py``): ``warp_affine``, ``resize``, ``crop_mirror_normalize``,
  ``resized_crop_mirror_normalize``, ``adjust_color``, each on dense or ragged batches
  (:class:`RaggedBatch`, packed by ``csrc/pack.cpp``).
* **CPU ops the readers call** (in the same extension, ``gpu_ops._C``): the JPEG crop decoder
  (``csrc/cpu/jpeg_decode.cpp``, libjpeg-turbo: :func:`gpu_ops.ops.decode_jpeg_crops`) and the
  record gather-and-checksum (``csrc/cpu/records.cpp``, XXH3-128:
  :func:`gpu_ops.ops.gather_check_xxh3`). Every native op has its Python function in
  :mod:`gpu_ops.ops`; nothing outside this package calls ``torch.ops.gpu_ops`` directly.
* **The native decoder** (``csrc/engine/``, a separate library built and loaded by
  :mod:`gpu_ops.engine`): GPU JPEG decode with nvJPEG on a C++ thread pool beside the GPU's
  hardware JPEG decoder; ``readers.gpu`` wraps it as ``decoder="engine"``.

The kernels take per-sample parameters as tensors and dispatch through the PyTorch dispatcher on
the input's device::

    import torch, gpu_ops
    imgs = torch.randint(0, 256, (8, 240, 320, 3), dtype=torch.uint8)       # decoder output, NHWC
    params = gpu_ops.RandomResizedCrop(224).generate_parameters(8, 240, 320)
    x = gpu_ops.resized_crop_mirror_normalize(imgs, params.boxes, 224,
                                              [123.7, 116.3, 103.5], [58.4, 57.1, 57.4],
                                              flip=params.flip)               # [8, 3, 224, 224]

See docs/gpu.md ("gpu_ops: fused augmentation kernels") for semantics, the build and the benchmark,
and docs/architecture.md ("gpu_ops: what it holds") for the map.
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
