"""Class folders (ImageFolder): each image sits in a first-level folder of IMAGES named after its class.

Read from IMAGES itself when no LABELS is given (:mod:`packer.sources.folders`: class ids follow the
sorted folder names), so the form has no parser and is never detected from LABELS; exported as
``--labels-form folders``, which writes no label file (the image keys already hold the folders)
and checks that each label agrees with its folder.
"""
from __future__ import annotations

import numpy as np

from packer.labels.base import LabelForm, LabelWriter


class ClassFolders(LabelWriter):
    """Class-per-subfolder: the keys already hold the class folder; checks they agree."""

    name = "folders"

    def add(self, key, label):
        top = key.split("/", 1)[0]
        if not isinstance(label, (int, np.integer)) or label < 0 or str(self.class_value(int(label))) != top:
            self.skipped.append({"key": key, "reason": f"label {label!r} does not match its folder {top!r}"})

    def finish(self):
        return None


FORM = LabelForm("folders", exports=(ClassFolders,), schemas=("class",))
