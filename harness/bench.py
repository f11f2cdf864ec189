"""`python -m harness.bench`: harness step time against a hand-written loop.

The code is in harness/studies/bench.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.bench import main

if __name__ == "__main__":
    sys.exit(one_line("bench", main))
