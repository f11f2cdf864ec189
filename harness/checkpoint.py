"""`python -m harness.checkpoint`: write a small pretrained checkpoint (nothing downloaded).

The code is in harness/studies/checkpoint.py; this file is only the command.
"""
import sys

from harness.studies.checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
