"""``python -m packer`` = the ``packer`` command."""
from packer.cli import main

# Guarded: spawn worker processes import the main module, which must not start a CLI run.
if __name__ == "__main__":
    main()
