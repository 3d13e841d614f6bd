"""Tests of the readers package: datasets, samplers, CPU crop decode, and the GPU loader (readers.gpu)."""
