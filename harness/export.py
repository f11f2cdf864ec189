"""`python -m harness.export <checkpoint> <out>`: a run's checkpoint as a Hugging Face safetensors directory.

The code is in harness/studies/export.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.export import main

if __name__ == "__main__":
    sys.exit(one_line("export", main))
