"""`python -m harness.gpu_check`: the first thing to run on a GPU machine (versions, CPU Adam, every backend on
gpt2_124m and llama_1b in bf16, a real CUDA OOM, and the checks), into results/gpu/<device>/.

The code is in harness/studies/gpu_check.py; this file is only the command.
"""
import sys

from harness.studies.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
