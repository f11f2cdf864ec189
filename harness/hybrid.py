"""`python -m harness.hybrid`: sharding inside a node against over every rank, on 2 emulated nodes and in theory.

The code is in harness/studies/hybrid.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.hybrid import main

if __name__ == "__main__":
    sys.exit(one_line("hybrid", main))
