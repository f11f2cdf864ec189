"""`python -m harness.estimate`: theory for every backend, no training.

The command line is checked first (config/command_line.py: one line for a misspelt flag, an unknown option or key,
in about a second, before torch is imported); the code is in harness/studies/estimate.py.
"""
import sys

from harness.config.command_line import one_line, refuse_bad_input
from harness.studies.flags import estimate_parser

if __name__ == "__main__":
    refuse_bad_input("estimate", estimate_parser())
    from harness.studies.estimate import main

    sys.exit(one_line("estimate", main))
