"""`python -m harness.scale_check`: the strategies traced at 8 to 512 ranks on fake tensors, against theory.

The code is in harness/studies/scale_check.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.scale_check import main

if __name__ == "__main__":
    sys.exit(one_line("scale-check", main))
