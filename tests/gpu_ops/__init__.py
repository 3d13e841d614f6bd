"""Tests of the gpu_ops package: its kernels (CPU and CUDA), their Python wrappers and their build."""
