"""Tests of packer.sources: finding the images and labels of an input folder."""
