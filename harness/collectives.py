"""`python -m harness.collectives`: time and bus bandwidth of each collective.

The code is in harness/studies/collectives.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.collectives import main

if __name__ == "__main__":
    sys.exit(one_line("collectives", main))
