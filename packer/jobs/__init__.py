"""What the commands do: build, verify/info, append, merge, convert, export, repair and the
distributed build, each a short composition of the shared steps in :mod:`packer.jobs.steps`.

The public entry points are re-exported by :mod:`packer`; the CLI calls those.
"""
