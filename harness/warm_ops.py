"""`python -m harness.warm_ops` (make warm): build DeepSpeed's JIT ops once into TORCH_EXTENSIONS_DIR.

The code is in harness/studies/warm_ops.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.warm_ops import main

if __name__ == "__main__":
    sys.exit(one_line("warm-ops", main))
