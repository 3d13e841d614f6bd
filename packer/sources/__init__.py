"""What a build reads: an image folder with its label files (:mod:`packer.sources.folders`)
and the class-name map pinned with ``--classes`` (:mod:`packer.sources.classes`).

Datasets in other stacks' formats are read by :mod:`packer.interchange` into the same
:class:`packer.sources.folders.Sources`.
"""
