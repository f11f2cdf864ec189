"""What the CUDA caching allocator reserves for a sequence of allocations and frees: its rules replayed, not fitted.

torch's published memory figures come in two kinds. `max_memory_allocated` counts the blocks handed out (each
request rounded up to 512 B); `max_memory_reserved` (torchtitan's logger, `nvidia-smi` less the context) counts the
segments the allocator took from the driver and keeps cached. The gap between them is fragmentation: a segment
that holds a live block cannot go back, and a freed block too small for the next request stays idle. It depends
on the order and the sizes of what a step allocates, so it is replayed here over that sequence (a traced step's:
runtime/simulate/allocations.py), by the rules of torch's native allocator (c10/cuda/CUDACachingAllocator.cpp,
its defaults; torch's "CUDA memory management" notes):

- a request is rounded up to a multiple of 512 B; up to 1 MiB it is "small" and served from the small pool, above
  from the large pool; the two pools never share a segment;
- the free block taken is the smallest that fits (ties: the lowest address), and only one on the same stream: a
  block freed on one stream is never handed to another;
- a block larger than the request is split when what remains is at least 512 B (small pool) or more than 1 MiB
  (large pool); the rest stays a free block beside it, and a freed block merges with free neighbours in its
  segment;
- where no cached block fits, a new segment is taken: 2 MiB for a small request, 20 MiB for one of 1 to 10 MiB,
  and the request rounded up to 2 MiB above that;
- where the driver has no room for it (`capacity_bytes` given), every cached segment holding no live block is
  released and the request retried once (an "alloc retry"); a request that still does not fit is an OOM;
- `expandable_segments:True` (PYTORCH_CUDA_ALLOC_CONF): one segment a stream and pool, grown at its end by 2 MiB
  pages (small pool) or 20 MiB pages (large pool) when no free block fits, the free block at its end absorbed.

Not modelled: `max_split_size_mb`, `roundup_power2_divisions` and `garbage_collection_threshold` (none is set by
default), CUDA graphs' private pools, and memory outside the allocator (the CUDA context, NCCL's buffers, cuBLAS'
workspace is inside it and counted only where the trace allocates it).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

MIN_BLOCK = 512  # every request rounds up to this
SMALL = 1 << 20  # the largest request served from the small pool
SMALL_SEGMENT = 2 << 20  # a small pool's segment (and expandable page)
MIN_LARGE_ALONE = 10 << 20  # requests of 1 to 10 MiB share a 20 MiB segment
LARGE_SEGMENT = 20 << 20  # and the large pool's expandable page
ROUND_LARGE = 2 << 20  # a request of 10 MiB and more gets a segment of itself rounded to this


def round_request(nbytes: int) -> int:
    """A request as the allocator serves it: at least 512 B, a multiple of 512 B."""
    return MIN_BLOCK * max(1, math.ceil(nbytes / MIN_BLOCK))


def segment_bytes(size: int) -> int:
    """The segment a rounded request takes from the driver where no cached block fits (native segments)."""
    if size <= SMALL:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALONE:
        return LARGE_SEGMENT
    return ROUND_LARGE * math.ceil(size / ROUND_LARGE)


@dataclass(eq=False)
class Block:
    segment: "Segment"
    offset: int
    size: int
    live: bool = False
    prev: Optional["Block"] = None
    next: Optional["Block"] = None

    def key(self) -> Tuple[int, int, int]:  # the pool's order: smallest first, then the lowest address
        return self.size, self.segment.number, self.offset


@dataclass(eq=False)
class Segment:
    number: int
    size: int
    pool: Tuple[str, bool]  # (stream, small)
    first: Optional[Block] = None


@dataclass
class Replay:
    """What the allocator held over the sequence: peaks of allocated and reserved bytes, retries, OOMs."""
    peak_allocated: int = 0
    peak_reserved: int = 0
    allocated: int = 0
    reserved: int = 0
    segments: int = 0  # taken from the driver over the replay (cudaMalloc calls, or expansions)
    alloc_retries: int = 0
    ooms: int = 0
    by_stream: Dict[str, int] = field(default_factory=dict)  # each stream's reserved bytes at the reserved peak


class CachingAllocator:
    """torch's native CUDA caching allocator, one device (module docstring)."""

    def __init__(self, expandable: bool = False, capacity_bytes: Optional[int] = None):
        self.expandable, self.capacity = expandable, capacity_bytes
        self.free_blocks: Dict[Tuple[str, bool], List[Tuple[Tuple[int, int, int], Block]]] = {}
        self.segments: List[Segment] = []
        self.grown: Dict[Tuple[str, bool], Segment] = {}  # expandable: the one segment of each pool
        self.live: Dict[object, Block] = {}
        self.numbered = 0  # segments taken so far: each its own number, the pool's address order
        self.stats = Replay()

    # -- the pools
    def _pool(self, pool) -> list:
        return self.free_blocks.setdefault(pool, [])

    def _insert(self, block: Block) -> None:
        bisect.insort(self._pool(block.segment.pool), (block.key(), block), key=lambda kb: kb[0])

    def _remove(self, block: Block) -> None:
        pool = self._pool(block.segment.pool)
        i = bisect.bisect_left(pool, block.key(), key=lambda kb: kb[0])
        assert pool[i][1] is block
        pool.pop(i)

    def _best_fit(self, pool, size: int) -> Optional[Block]:
        blocks = self._pool(pool)
        i = bisect.bisect_left(blocks, (size, -1, -1), key=lambda kb: kb[0])
        return blocks[i][1] if i < len(blocks) else None

    # -- the driver
    def _take(self, nbytes: int) -> bool:
        """Reserve `nbytes` more from the driver, releasing the cached segments once where it has no room."""
        if self.capacity is not None and self.stats.reserved + nbytes > self.capacity:
            self.stats.alloc_retries += 1
            self._release_cached()
            if self.stats.reserved + nbytes > self.capacity:
                self.stats.ooms += 1
                return False
        self.stats.reserved += nbytes
        self.stats.segments += 1
        return True

    def _release_cached(self) -> None:
        for segment in list(self.segments):
            block = segment.first
            if block is not None and not block.live and block.next is None and block.size == segment.size:
                self._remove(block)
                self.segments.remove(segment)
                self.stats.reserved -= segment.size
                if self.grown.get(segment.pool) is segment:
                    del self.grown[segment.pool]

    def _new_segment(self, pool, size: int) -> Optional[Block]:
        if not self._take(size):
            return None
        self.numbered += 1
        segment = Segment(self.numbered, size, pool)
        segment.first = Block(segment, 0, size)
        self.segments.append(segment)
        return segment.first

    def _grow(self, pool, size: int) -> Optional[Block]:
        """Expandable segments: map pages at the pool's segment's end, absorbing a free block there."""
        page = SMALL_SEGMENT if pool[1] else LARGE_SEGMENT
        segment = self.grown.get(pool)
        if segment is None:
            block = self._new_segment(pool, page * math.ceil(size / page))
            if block is not None:
                self.grown[pool] = block.segment
            return block
        last = segment.first
        while last.next is not None:
            last = last.next
        tail = 0 if last.live else last.size
        extra = page * math.ceil((size - tail) / page)
        if not self._take(extra):
            return None
        segment.size += extra
        if last.live:
            block = Block(segment, last.offset + last.size, extra, prev=last)
            last.next = block
            return block
        self._remove(last)
        last.size += extra
        return last

    # -- requests
    def malloc(self, key, nbytes: int, stream: str = "default") -> bool:
        """Hand out a block for the storage `key`; False where the device is out of memory."""
        size = round_request(nbytes)
        pool = (stream, size <= SMALL)
        block = self._best_fit(pool, size)
        if block is not None:
            self._remove(block)
        else:
            block = (self._grow if self.expandable else self._new_segment)(pool, size if self.expandable
                                                                           else segment_bytes(size))
            if block is None:
                return False
        remaining = block.size - size
        if remaining >= MIN_BLOCK if pool[1] else remaining > SMALL:
            rest = Block(block.segment, block.offset + size, remaining, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest)
        block.live = True
        self.live[key] = block
        s = self.stats
        s.allocated += block.size
        if s.allocated > s.peak_allocated:
            s.peak_allocated = s.allocated
        if s.reserved > s.peak_reserved:
            s.peak_reserved = s.reserved
            s.by_stream = self.reserved_by_stream()
        return True

    def free(self, key) -> None:
        block = self.live.pop(key, None)
        if block is None:  # allocated before the replay began, or never handed out (an OOM)
            return
        self.stats.allocated -= block.size
        block.live = False
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.live:
                self._remove(neighbour)
                first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                block = first
        self._insert(block)

    def reserved_by_stream(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for segment in self.segments:
            out[segment.pool[0]] = out.get(segment.pool[0], 0) + segment.size
        return out


def replay(events: Iterable[tuple], expandable: bool = False, capacity_bytes: Optional[int] = None) -> Replay:
    """Replay `events`, ("alloc", key, bytes, stream) and ("free", key), in order over one allocator."""
    allocator = CachingAllocator(expandable, capacity_bytes)
    for event in events:
        if event[0] == "alloc":
            allocator.malloc(event[1], event[2], event[3] if len(event) > 3 else "default")
        else:
            allocator.free(event[1])
    return allocator.stats


def live_peak(events: Iterable[tuple]) -> int:
    """The most bytes live at once over `events`, unrounded: what the memory tracker's peak counts."""
    sizes, now, peak = {}, 0, 0
    for event in events:
        if event[0] == "alloc":
            sizes[event[1]] = event[2]
            now += event[2]
            peak = max(peak, now)
        else:
            now -= sizes.pop(event[1], 0)
    return peak
