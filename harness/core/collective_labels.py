"""What a caller says its collectives are, for the collective counter (runtime/measure/collective_count.py), where
an op's arguments cannot say it: the ring attention's rotations on CPU (parallel/cp/ring_cpu.py) are c10d
all-to-alls that each send a rank's whole buffer to one peer, a `permute`, as torch's functional rotations say by
their split sizes. Stdlib only; per thread, as the counter (a dispatch mode) is."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

_HELD = threading.local()


@contextlib.contextmanager
def labelled(name: str) -> Iterator[None]:
    """The collectives issued on this thread inside the block are `name`."""
    before = getattr(_HELD, "name", None)
    _HELD.name = name
    try:
        yield
    finally:
        _HELD.name = before


def current() -> Optional[str]:
    """The label of the block this thread is in, or None."""
    return getattr(_HELD, "name", None)
