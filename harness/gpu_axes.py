"""`python -m harness.gpu_axes`: compile, float8, checkpointing and DeepCompile on one GPU (`make gpu-axes`).

The code is in harness/studies/gpu_axes.py."""
import sys

from harness.studies.gpu_axes import main

if __name__ == "__main__":
    sys.exit(main())
