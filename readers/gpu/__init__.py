"""From a packer store to a normalized GPU batch: raw-bytes reads, batched GPU decode, prefetch,
and train / val / detection pipelines over ragged batches (see docs/gpu.md).

    from readers.gpu import GPULoader, TrainPipeline
    loader = GPULoader("train.lmdb", TrainPipeline(224, dtype=torch.bfloat16), batch_size=256,
                       shuffle=True, seed=0)
    for images, labels in loader:   # images: [256, 3, 224, 224] bfloat16 on the GPU
        ...

Layout: :mod:`readers.gpu.decoders` is the decoder contract (the ``Decoder`` base class with its
capability flags and "not supported" defaults, ``DecodeError``, the registry, ``get_decoder``); each
decoder lives in its own module (``turbo``, ``nvjpeg``, ``nvimgcodec``, ``split``, ``engine``: the
native one, ``cpucrops``: crops decoded on the CPU) and registers itself on import, below; ``roi``
plans crop windows and dispatches a batch to its decoder's path (``decode_batch``); ``pipelines``
transform decoded batches; ``loader`` joins them with threads and queues;
``queues`` sets CUDA's hardware queues on import, first. Raw reads are CPU-side, in
:mod:`readers.raw`.
"""
# First (isort keeps it first): sets CUDA's hardware queues for the loader's streams before
# anything can start CUDA (readers/gpu/queues.py).
from readers.gpu import queues
from readers.gpu.cpucrops import CpuCropDecoder
from readers.gpu.decoders import DecodeError, Decoder, available_decoders, get_decoder, register_decoder
from readers.gpu.engine import EngineDecoder, engine_status
from readers.gpu.loader import Batch, GPULoader, batch_seed

# Importing a decoder module registers its name with readers.gpu.decoders (torchvision.models does
# the same with its model builders), so every decoder module is imported here.
from readers.gpu.nvimgcodec import NvImageCodecDecoder
from readers.gpu.nvjpeg import NvJpegDecoder
from readers.gpu.pipelines import (
                                   IMAGENET_MEAN,
                                   IMAGENET_STD,
                                   DetectionBatch,
                                   DetectionPipeline,
                                   TrainPipeline,
                                   ValPipeline,
                                   boxes_to_original,
)
from readers.gpu.split import SplitDecoder
from readers.gpu.turbo import TurboJpegDecoder
from readers.raw import RawBatch, RawReader, read_raw

__all__ = ["GPULoader", "Batch", "batch_seed", "TrainPipeline", "ValPipeline", "DetectionPipeline", "DetectionBatch",
           "boxes_to_original", "IMAGENET_MEAN", "IMAGENET_STD", "RawReader", "RawBatch", "read_raw",
           "NvJpegDecoder", "TurboJpegDecoder", "CpuCropDecoder", "NvImageCodecDecoder", "SplitDecoder", "DecodeError",
           "get_decoder", "Decoder", "register_decoder", "available_decoders", "EngineDecoder", "gpu_info"]


def gpu_info(device="cuda") -> dict:
    """What the GPU path would use here, and why: the native engine's status (built? why not?),
    the decoders registered, the one ``decoder="auto"`` picks on ``device``, and CUDA's hardware
    queues (``cuda_queues``: :func:`readers.gpu.queues.status`)."""
    import torch

    info = {"cuda": torch.cuda.is_available(), "engine": engine_status(), "decoders": list(available_decoders()),
            "cuda_queues": queues.status()}
    if torch.cuda.is_available() or torch.device(device).type == "cpu":
        dec = get_decoder("auto", device)
        info["auto"] = dec.name
        dec.close()
    return info
