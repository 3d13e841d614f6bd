"""The bottom layer: what every other part of packer stands on, importing nothing above it.

errors (the exception hierarchy), uri (store locations, password redaction), records (Record,
StoreMetadata, checksums, bounded JSON), integrity (checking and re-encoding one image),
diskspace (room checks, disk-full errors), locking (one writer per output), workers (the
process/thread pool with ordered results), sharding (splitting a sorted input list).
"""
