"""`python -m harness.gpu_axes`: compile, float8, checkpointing and DeepCompile on one GPU (`make gpu-axes`).

The code is in harness/studies/gpu_axes.py."""
import sys

from harness.config.command_line import one_line
from harness.studies.gpu_axes import main

if __name__ == "__main__":
    sys.exit(one_line("gpu-axes", main))
