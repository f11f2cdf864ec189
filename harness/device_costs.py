"""`python -m harness.device_costs`: this device's costs for the time model, measured once.

The code is in harness/studies/device_costs.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.device_costs import main

if __name__ == "__main__":
    sys.exit(one_line("device-costs", main))
