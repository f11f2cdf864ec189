"""`python -m harness.report`: rebuild a sweep's tables, report and plots from its run dirs.

The code is in harness/reporting/sweep_report.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.reporting.sweep_report import main

if __name__ == "__main__":
    sys.exit(one_line("report", main))
