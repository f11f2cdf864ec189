"""`python -m harness.advise`: which strategy should I use for this model on this hardware?

The command line is checked first (config/command_line.py: one line for a misspelt flag, an unknown option or key,
in about a second, before torch is imported). The search is in harness/studies/advise.py (its docstring says
how), the answer in harness/studies/advise_answer.py.
"""
import sys

from harness.config.command_line import one_line, refuse_bad_input
from harness.studies.flags import advise_parser

if __name__ == "__main__":
    refuse_bad_input("advise", advise_parser())
    from harness.studies.advise_answer import main

    sys.exit(one_line("advise", main))
