"""`python -m harness.estimate`: theory for every backend, no training.

The code is in harness/studies/estimate.py; this file is only the command.
"""
import sys

from harness.studies.estimate import main

if __name__ == "__main__":
    sys.exit(main())
