"""`python -m harness.capacity`: the largest model per backend under a memory budget.

The code is in harness/studies/capacity.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.capacity import main

if __name__ == "__main__":
    sys.exit(one_line("capacity", main))
