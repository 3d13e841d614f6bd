"""The installed packer's version, in a module of its own: code inside the package reads it from
here and never imports the package ``__init__`` (which imports the whole public API)."""
__version__ = "0.1.0"
