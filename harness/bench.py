"""`python -m harness.bench`: harness step time against a hand-written loop.

The code is in harness/studies/bench.py; this file is only the command.
"""
import sys

from harness.studies.bench import main

if __name__ == "__main__":
    sys.exit(main())
