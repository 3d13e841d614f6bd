"""``python -m packer`` = the ``packer`` command."""
from .cli import main

main()
