"""`python -m harness.memory_check`: the memory model against measured peaks over a matrix of runs.

The code is in harness/studies/memory_check.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.memory_check import main

if __name__ == "__main__":
    sys.exit(one_line("memory-check", main))
