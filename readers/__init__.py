"""PyTorch readers for packer stores: lazy per-process handles, libjpeg-turbo decode.

    from readers import StoreDataset, collate_boxes
    ds = StoreDataset("train.lmdb", min_size=256)
"""
from .dataset import (HDF5Dataset, LMDBDataset, MongoDataset, StoreDataset, collate_boxes,
                      collate_list, collate_skipping)
from .decode import choose_scale, decode_jpeg, parse_scale

__all__ = ["StoreDataset", "LMDBDataset", "HDF5Dataset", "MongoDataset", "collate_boxes", "collate_list",
           "collate_skipping", "decode_jpeg", "choose_scale", "parse_scale"]
