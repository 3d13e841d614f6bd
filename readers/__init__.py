"""PyTorch readers for packer stores: lazy per-process handles, libjpeg-turbo decode.

    from readers import StoreDataset, collate_boxes
    ds = StoreDataset("train.lmdb", min_size=256)

    # the fast CPU training path: whole batches decoded into random-resized crops in C++
    from readers import CropDataset, RandomResizedCrop, collate_decoded, DistributedSampler
    ds = CropDataset("train.lmdb", RandomResizedCrop(224))
    full = CropDataset("val.lmdb", FullDecode(), layout="HWC")   # stored size, one size per batch
    loader = BatchLoader(ds, batch_size=256, shuffle=True)   # no workers: read/decode on threads

    # checked stored bytes, no decode (what the GPU loader in readers.gpu reads through)
    raw = RawReader("train.lmdb", threads=8).read([0, 5, 9])

The CPU modules here never import readers.gpu (an import-linter contract in pyproject.toml).
"""
from readers.crops import CropSpec, FullDecode, RandomResizedCrop, ResizeCenterCrop, decode_crops
from readers.dataset import (
                             HDF5Dataset,
                             LMDBDataset,
                             MongoDataset,
                             StoreDataset,
                             collate_boxes,
                             collate_detection,
                             collate_list,
                             collate_skipping,
)
from readers.decode import choose_scale, decode_jpeg, parse_scale
from readers.loader import BatchLoader
from readers.raw import RawBatch, RawReader, read_raw
from readers.sampler import DistributedSampler
from readers.train import CropDataset, DecodedBatch, collate_decoded
from readers.transforms import Resize

__all__ = ["StoreDataset", "LMDBDataset", "HDF5Dataset", "MongoDataset", "collate_boxes", "collate_list",
           "collate_skipping", "collate_detection", "decode_jpeg", "choose_scale", "parse_scale",
           "CropDataset", "DecodedBatch", "collate_decoded", "RandomResizedCrop", "ResizeCenterCrop",
           "FullDecode", "CropSpec", "decode_crops", "DistributedSampler", "BatchLoader", "Resize",
           "RawReader", "RawBatch", "read_raw"]
