"""Tests of what the packer commands show and keep: CLI output and exit codes, reports, messages, the
user's files."""
