"""`python -m harness.published`: published runs at 8 to 256 GPUs against the theory (`make published`).

The code is in harness/studies/published.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.published import main

if __name__ == "__main__":
    sys.exit(one_line("published", main))
