"""`python -m harness.loss_agreement`: the runs of a sweep against their reference runs: losses, divergence, memory.

The code is in harness/studies/loss_agreement.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.loss_agreement import main

if __name__ == "__main__":
    sys.exit(one_line("loss-agreement", main))
