"""`python -m harness.gpu_capacity`: the largest model each strategy trains on one GPU (`make gpu-capacity`).

The command line is checked first (studies/flags.py: one line, before torch is imported); the code is in
harness/studies/gpu_capacity.py.
"""
import sys

from harness.studies.flags import gpu_capacity_parser, gpu_capacity_problem, refuse_bad_input

if __name__ == "__main__":
    refuse_bad_input("gpu_capacity", gpu_capacity_parser(), check=gpu_capacity_problem)
    from harness.studies.gpu_capacity import main

    sys.exit(main())
