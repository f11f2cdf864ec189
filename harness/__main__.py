"""`python -m harness <command> [args]`: the same commands as `shardbench <command>` (harness/commands.py)."""
import sys

from harness.commands import main

sys.exit(main())
