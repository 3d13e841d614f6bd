"""Tests of packer.stores: the store contract over every format, each backend (LMDB, HDF5, MongoDB),
stores damaged, cut or replaced under their readers."""
