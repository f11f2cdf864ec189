"""`python -m harness.axes`: the axes sweep's table (harness/studies/axes.py)."""
from .studies.axes import main

if __name__ == "__main__":
    raise SystemExit(main())
