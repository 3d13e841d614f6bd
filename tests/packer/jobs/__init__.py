"""Tests of packer.jobs: build, repair, convert, export, append, merge and sharded (Dask) builds."""
