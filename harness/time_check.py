"""`python -m harness.time_check`: the time model against measured steps, part by part.

The code is in harness/studies/time_check.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.time_check import main

if __name__ == "__main__":
    sys.exit(one_line("time-check", main))
