"""`python -m harness.time_extrapolate`: the time model predicting runs it was not calibrated on, then running them.

The code is in harness/studies/time_extrapolation.py; this file is only the command.
"""
import sys

from harness.studies.time_extrapolation import main

if __name__ == "__main__":
    sys.exit(main())
