"""`python -m harness.axes`: the axes sweep's table (harness/studies/axes.py)."""
from harness.config.command_line import one_line
from harness.studies.axes import main

if __name__ == "__main__":
    raise SystemExit(one_line("axes", main))
