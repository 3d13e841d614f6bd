"""Tests of object storage (packer.core.remote and the jobs on s3:// URLs), against the S3 test server."""
