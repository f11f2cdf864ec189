"""`python -m harness.gpu_axes`: the axes beside the strategy on one GPU (`make gpu-axes`); the code is in
harness/studies/gpu_axes.py."""
import sys

from harness.studies.gpu_axes import main

if __name__ == "__main__":
    sys.exit(main())
