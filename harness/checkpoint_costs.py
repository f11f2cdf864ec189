"""`python -m harness.checkpoint_costs`: what saving and resuming cost under each backend (`make checkpoint`).

The code is in harness/studies/checkpoint_costs.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.checkpoint_costs import main

if __name__ == "__main__":
    sys.exit(one_line("checkpoint-costs", main))
