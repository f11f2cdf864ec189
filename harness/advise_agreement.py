"""`python -m harness.advise_agreement`: how often the advisor's dry run picks what its real runs picked.

The code is in harness/studies/advise_agreement.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.advise_agreement import main

if __name__ == "__main__":
    sys.exit(one_line("advise-agreement", main))
