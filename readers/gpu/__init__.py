"""From a packer store to a normalized GPU batch: raw-bytes reads, batched GPU decode, prefetch,
and train / val / detection pipelines over ragged batches (see README, "GPU pipeline").

    from readers.gpu import GPULoader, TrainPipeline
    loader = GPULoader("train.lmdb", TrainPipeline(224, dtype=torch.bfloat16), batch_size=256,
                       shuffle=True, seed=0)
    for images, labels in loader:   # images: [256, 3, 224, 224] bfloat16 on the GPU
        ...
"""
from .decoders import DecodeError, NvJpegDecoder, TurboJpegDecoder, get_decoder
from .loader import Batch, GPULoader, batch_seed
from .pipelines import (IMAGENET_MEAN, IMAGENET_STD, DetectionBatch, DetectionPipeline, TrainPipeline, ValPipeline,
                        boxes_to_original)
from .raw import RawBatch, RawReader, read_raw

__all__ = ["GPULoader", "Batch", "batch_seed", "TrainPipeline", "ValPipeline", "DetectionPipeline", "DetectionBatch",
           "boxes_to_original", "IMAGENET_MEAN", "IMAGENET_STD", "RawReader", "RawBatch", "read_raw",
           "NvJpegDecoder", "TurboJpegDecoder", "DecodeError", "get_decoder"]
