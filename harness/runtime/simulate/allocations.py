"""The order in which a traced step allocates and frees its storages, for the caching allocator's replay
(theory/allocator.py): what the reserved bytes of a real GPU run depend on, beyond the live bytes at the peak.

torch's memory tracker (runtime/simulate/traced.py) already sees every storage come (ADD), go (DEL) and resize
(SIZE: FSDP2 frees an unsharded parameter's storage by resizing it to 0, and gathers into it again). This log
hooks the one method each of those passes through and keeps the sequence, the storages the tracker holds when
the log starts (parameters, gradients, optimizer state) first, in the order it registered them.

Streams. The allocator never hands a block freed on one stream to another, so where a strategy allocates on a
stream of its own the log says which: `streams` maps a tracker kind to the stream its storages were allocated on,
applied when a storage is given that kind (FSDP2's tracker names an all-gather's output after allocating it).
"""
from __future__ import annotations

import contextlib
from typing import Dict, List


class AllocationLog:
    """("alloc", key, bytes, stream) and ("free", key) events of one tracker, in order."""

    def __init__(self, streams: Dict[str, str] | None = None):
        self.streams = streams or {}
        self.events: List[list] = []
        self._open: Dict[int, tuple] = {}  # id(winfo) -> (winfo, its open alloc event); the winfo held, its id unique
        self._serial = 0

    def _alloc(self, winfo) -> None:
        nbytes = int(winfo.size) * int(winfo.element_size)
        if nbytes <= 0:
            return
        self._serial += 1
        event = ["alloc", self._serial, nbytes, self._stream(winfo)]
        self.events.append(event)
        self._open[id(winfo)] = (winfo, event)

    def _free(self, winfo) -> None:
        held = self._open.pop(id(winfo), None)
        if held is not None:
            self.events.append(["free", held[1][1]])

    def _stream(self, winfo) -> str:
        return self.streams.get(getattr(winfo.reftype, "value", str(winfo.reftype)), "default")

    def record(self, u_type, winfo) -> None:
        """One tracker update: a storage added, deleted, resized, or given another kind."""
        name = u_type.name
        if name == "ADD":
            self._alloc(winfo)
        elif name == "DEL":
            self._free(winfo)
        elif name == "SIZE":  # a resize frees the old storage and allocates the new one, as the allocator sees it
            self._free(winfo)
            self._alloc(winfo)
        elif name == "REF" and id(winfo) in self._open and self._stream(winfo) != "default":
            self._open[id(winfo)][1][3] = self._stream(winfo)

    @contextlib.contextmanager
    def on(self, tracker):
        """Log `tracker`'s updates while it runs (enter this before the tracker)."""
        original = tracker._update_snap
        # what the tracker registered before (torch's MemTracker takes the model and optimizer at track_external)
        for winfo, _ in list(tracker._WINFO.values()):
            self._alloc(winfo)

        def update(u_type, winfo, *args, **kwargs):
            self.record(u_type, winfo)
            return original(u_type, winfo, *args, **kwargs)

        tracker._update_snap = update
        try:
            yield self
        finally:
            tracker._update_snap = original
