"""`python -m harness.fault_drill`: inject every fault; status and time to detect.

The code is in harness/studies/fault_drill.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.fault_drill import main

if __name__ == "__main__":
    sys.exit(one_line("fault-drill", main))
