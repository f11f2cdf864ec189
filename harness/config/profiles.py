"""Two settings profiles for the frameworks, chosen with `profile=native|parity`.

- **native** (the default for every run and sweep): each framework as its own documentation sets it up.
  The harness passes only what a run is (stage, offload, batch, precision, clipping) and leaves every tuning
  knob (buckets, overlap, prefetch, what stays gathered) at the framework's default. A comparison then
  reflects the frameworks, not our choices.
- **parity**: settings chosen for exact accounting and loss parity, which the tests use: one gradient bucket
  sized to the model, every parameter of a sharding backend sharded (so sharding shows on tiny models), no
  overlap, and gradients accumulated in fp32 everywhere.

`differences()` is every setting that differs, with the documentation behind the native value, gathered from
each family's package (harness/backends/); the table in docs/strategies.md is this list (tests/test_profiles.py holds
them equal). Both profiles run the same optimizer and the same mixed-precision recipe in each family.
"""
from __future__ import annotations

from typing import Tuple

from .schema import CHOICES

NATIVE, PARITY = CHOICES["profile"]


def differences() -> Tuple:
    """Every setting that differs between the profiles, each family's rows (config/families.py's Difference)."""
    from . import families

    return tuple(row for family in families.every() for row in family.differences)
