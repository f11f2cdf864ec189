"""`python -m harness.gpu_check`: the first thing to run on a GPU machine, into results/gpu/<device>/.

It checks the versions and DeepSpeed's CPU Adam, runs every backend on gpt2_124m and llama_1b in bf16, injects a
real CUDA OOM, and checks the results.

The code is in harness/studies/gpu_check.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.gpu_check import main

if __name__ == "__main__":
    sys.exit(one_line("gpu-check", main))
