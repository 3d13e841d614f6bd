"""Optional dependencies: import one, or say in one line what to install.

Every module of packer (and readers) that needs a package only for some feature imports it
through :func:`optional_import`, so every "missing package" message reads the same::

    the HTML report needs matplotlib: pip install 'packer-vision[report]'

and keeps the ImportError as its ``__cause__``. A package that is installed but fails to import
(a broken build, a dependency of its own missing) is said as such, with the real error, instead
of a pip command that would change nothing.

``extra`` is the name of an extra in ``setup.cfg``'s ``[options.extras_require]``
(``tests/packer/core/test_deps.py`` checks every call site names one that exists); a core
dependency, which a plain ``pip install packer-vision`` already brings, passes ``extra=None`` and
the pip name of the package.

Example:
    >>> h5py = optional_import("h5py", "the HDF5 store", package="h5py")   # doctest: +SKIP
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Optional

from packer.core.errors import DependencyError

#: The distribution packer is installed as (what every install hint names, with an extra).
DISTRIBUTION = "packer-vision"


def install_hint(extra: Optional[str], package: Optional[str] = None) -> str:
    """The pip command that brings a dependency: the extra's, or the package's own."""
    if extra is not None:
        return f"pip install '{DISTRIBUTION}[{extra}]'"
    if not package:
        raise ValueError("install_hint needs an extra or a package name")
    return f"pip install {package}"


def missing_message(module: str, feature: str, extra: Optional[str], package: Optional[str] = None,
                    exc: Optional[BaseException] = None) -> str:
    """What :func:`optional_import` says when ``module`` does not import.

    ``<feature> needs <package>: <pip command>``, or, when the package is installed but its import
    fails for another reason, ``<feature> needs <package>, which is installed but does not import:
    <the error>``.
    """
    top = module.partition(".")[0]
    try:
        installed = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        installed = False
    name = (package or top).strip("'\"")     # the distribution users know (mosaicml-streaming)
    if installed and exc is not None and not _is_missing(exc, top):
        return (f"{feature} needs {name}, which is installed but does not import: "
                f"{type(exc).__name__}: {exc}")
    return f"{feature} needs {name}: {install_hint(extra, package or top)}"


def _is_missing(exc: BaseException, top: str) -> bool:
    """True when ``exc`` says the package itself is absent (not something it imports)."""
    name = getattr(exc, "name", None) or ""
    return isinstance(exc, ModuleNotFoundError) and (name == top or name.startswith(top + "."))


def optional_import(module: str, feature: str, extra: Optional[str] = None, *,
                    package: Optional[str] = None) -> ModuleType:
    """Import ``module`` (dotted names too), or raise DependencyError saying what to install.

    Args:
        module: what to import (``"pymongo"``, ``"matplotlib.figure"``).
        feature: what needs it, as the message's subject (``"the MongoDB store"``).
        extra: the ``packer-vision`` extra that installs it (must exist in setup.cfg), or None
            for a core dependency (then ``package`` says what to pip install).
        package: the pip name when it is not the module's (``"'PyTurboJPEG<2'"``).

    Raises:
        DependencyError: ``module`` does not import; the ImportError is its ``__cause__``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DependencyError(missing_message(module, feature, extra, package, exc)) from exc


__all__ = ["optional_import", "missing_message", "install_hint", "DISTRIBUTION"]
