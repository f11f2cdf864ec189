"""`python -m harness.pretrain`: write a small pretrained checkpoint (nothing downloaded).

The code is in harness/studies/pretrain.py; this file is only the command.
"""
import sys

from harness.config.command_line import one_line
from harness.studies.pretrain import main

if __name__ == "__main__":
    sys.exit(one_line("pretrain", main))
