"""`python -m harness.gpu_capacity`: the largest model each strategy trains on one GPU (`make gpu-capacity`).

The code is in harness/studies/gpu_capacity.py; this file is only the command.
"""
import sys

from harness.studies.gpu_capacity import main

if __name__ == "__main__":
    sys.exit(main())
