"""Tests of packer.labels: label forms parsed, stored and written back."""
