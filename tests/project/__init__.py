"""Whole-project checks: architecture and lint, docs and README examples, installs, exceptions across
processes, scripts."""
