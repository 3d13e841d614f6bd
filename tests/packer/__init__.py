"""Tests of the packer package, one folder per area (its subpackages, plus remote and cli)."""
