"""`python -m harness.gpu_capacity`: the largest model each strategy trains on one GPU (`make gpu-capacity`).

The command line is checked first (config/command_line.py: one line, before torch is imported); the code is in
harness/studies/gpu_capacity.py.
"""
import sys

from harness.config.command_line import one_line

if __name__ == "__main__":
    from harness.studies.gpu_capacity import main

    sys.exit(one_line("gpu-capacity", main))
