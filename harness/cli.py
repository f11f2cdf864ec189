"""`shardbench <command> [args]`: one entry point for every `python -m harness.<command>` tool.

The console script `make install` puts in .venv/bin; the code is in harness/core/commands.py.
"""
import sys

from harness.core.commands import main

if __name__ == "__main__":
    sys.exit(main())
