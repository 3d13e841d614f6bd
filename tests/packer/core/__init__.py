"""Tests of packer.core: input checks (integrity, bombs, image formats), record checksums, locking,
workers, optional dependencies."""
