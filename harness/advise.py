"""`python -m harness.advise`: which strategy should I use for this model on this hardware?

The search is in harness/studies/advise.py (its docstring says how), the answer in
harness/studies/advise_answer.py; this file is only the command.
"""
import sys

from harness.studies.advise_answer import main

if __name__ == "__main__":
    sys.exit(main())
