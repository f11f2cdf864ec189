"""`python -m harness.estimate`: theory for every backend, no training.

The command line is checked first (studies/flags.py: one line for a misspelt flag, an unknown option or key,
in about a second, before torch is imported); the code is in harness/studies/estimate.py.
"""
import sys

from harness.studies.flags import estimate_parser, one_line, refuse_bad_input

if __name__ == "__main__":
    refuse_bad_input("estimate", estimate_parser())
    from harness.studies.estimate import main

    sys.exit(one_line("estimate", main))
