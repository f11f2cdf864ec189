"""`python -m harness.time_extrapolate`: the time model predicting runs it was not calibrated on, then running them.

The code is in harness/studies/time_extrapolation.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.time_extrapolation import main

if __name__ == "__main__":
    sys.exit(one_line("time-extrapolate", main))
