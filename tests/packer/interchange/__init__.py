"""Tests of packer.interchange: WebDataset, Hugging Face datasets, MDS and TFRecord in and out."""
