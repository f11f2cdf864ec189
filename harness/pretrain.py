"""`python -m harness.pretrain`: write a small pretrained checkpoint (nothing downloaded).

The code is in harness/studies/pretrain.py; this file is only the command.
"""
import sys

from harness.studies.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
