"""The storages a communication library frees late, or out of the profiler's sight, read off torch's profiler
(runtime/measure/memory_profile.py counts them as freed when the training thread was done with them): gloo keeps a
finished collective's tensors until it moves on, at a moment that changes from run to run, and its worker thread's
frees are not recorded."""
from __future__ import annotations

import bisect
import itertools
from collections import Counter
from typing import Dict, NamedTuple, Optional


def training_thread(allocations) -> int:
    """The thread that allocates most: the one running the step."""
    threads: Dict[int, int] = {}
    for e, _ in allocations:
        threads[e.start_tid] = threads.get(e.start_tid, 0) + 1
    return max(threads, key=threads.get)


def storages_read(fields) -> set:
    """The storages an op's inputs point at (the profile's record_shapes)."""
    found = set()
    for value in fields.inputs:
        for item in (value if isinstance(value, list) else [value]):
            ptr = getattr(item, "storage_data_ptr", None)
            if ptr:
                found.add(ptr)
    return found


class _StepEvents:
    """What both readings need from a profiled step: its allocations in time order, the training thread, that
    thread's collective calls in order, and when each storage was read by an op (the profile's record_shapes)."""

    def __init__(self, prof):
        from torch._C._profiler import _EventType
        events = typed_events(prof)
        self.allocations = sorted(((e, fields) for e, kind, fields in events if kind == _EventType.Allocation),
                                  key=lambda ef: ef[0].start_time_ns)
        self.training = training_thread(self.allocations) if self.allocations else None
        ops = [(op, storages_read(fields)) for op, kind, fields in events
               if kind == _EventType.TorchOp and op.start_tid == self.training]
        # the training thread's collective calls, in order: one thread runs one call at a time
        self.calls = sorted(((op.start_time_ns, op.end_time_ns, used) for op, used in ops
                             if op.name.startswith("c10d::")), key=lambda c: c[0])
        self.starts = [c[0] for c in self.calls]
        self.reach = list(itertools.accumulate((c[1] for c in self.calls), max))  # the latest end among calls[:k+1]
        self.uses: Dict[int, list] = {}
        for op, used in ops:
            for ptr in used:
                self.uses.setdefault(ptr, []).append(op.end_time_ns)

    @classmethod
    def of(cls, prof) -> "_StepEvents":
        """Read once a profile: both readings, and each profiled step's two peaks, take it."""
        cached = getattr(prof, "_shardbench_step", None)
        if cached is None:
            cached = prof._shardbench_step = cls(prof)
        return cached

    def done_with(self, ptr: int, born: int, by: float) -> int | None:
        """When the training thread was last done with a storage born at `born`, by time `by`: the end of its last
        use by an op, and at least the end of the first collective call after its birth."""
        after = [end for start, end, _ in self.calls[bisect.bisect_left(self.starts, born):] if end <= by]
        used = [u for u in self.uses.get(ptr, []) if born <= u <= by]
        return max(used + after[:1]) if used or after else None

    def collective_read(self, ptr: int, born: int) -> bool:
        return any(ptr in used for _, _, used in self.calls[bisect.bisect_left(self.starts, born):])


def collective_frees(prof) -> Dict[tuple, int]:
    """(free time, pointer) -> when the training thread was done with that storage, for the buffers a
    communication library frees late. gloo keeps a finished collective's work, and with it its tensors, until
    it moves on, at a moment that changes from run to run: measured, ZeRO-2's flattened gradient bucket was
    freed right after its all-reduce in some runs and inside the next collective call, a whole optimizer step
    later, in others (a 10% swing of a tiny model's peak, rank by rank). A storage that the training thread
    frees inside a collective call that does not use it, or that another thread frees, was held by the
    communication library; it is counted as freed when the training thread was last done with it
    (_StepEvents.done_with). Needs the profile's record_shapes (op inputs)."""
    step = _StepEvents.of(prof)
    out, allocated_at = {}, {}
    for e, fields in step.allocations:
        ptr, size, t = fields.ptr, fields.alloc_size, e.start_time_ns
        if size > 0:
            allocated_at[ptr] = t
            continue
        # the latest-begun call that holds time t (a call may run inside another): none when no call that
        # began by now reaches t, which is most frees
        i = bisect.bisect_right(step.starts, t) - 1
        while i >= 0 and step.reach[i] >= t and step.calls[i][1] < t:
            i -= 1
        inside = i >= 0 and step.calls[i][1] >= t
        late = e.start_tid != step.training or (inside and ptr not in step.calls[i][2])
        born = allocated_at.get(ptr)
        if not late or born is None:
            continue
        done = step.done_with(ptr, born, t)
        if done is not None and done < t:
            out[(t, ptr)] = done
    return out


class LostFree(NamedTuple):
    """A storage whose free the profile never saw: its size, when the training thread was done with it, and, where
    the allocator handed its address out again, when and for how many bytes."""
    bytes: int
    done: int
    reborn: Optional[int] = None
    reborn_bytes: int = 0


def lost_frees(prof, device_type: str) -> Dict[tuple, LostFree]:
    """(birth time, pointer) -> LostFree, for the storages on `device_type` whose free the profile never saw.
    gloo's worker thread lets go of a finished collective's work outside the profiler's scope: where it, not the
    training thread, drops the last reference (under load the training thread is often quicker), the storage is
    freed unrecorded and reads as live from then on. Measured on ZeRO-2 in bf16 at grad_accum 2 under load: on
    the rank that did not see it, the flattened bucket of a micro-batch's all-reduce (250,496 B, the whole
    model's bf16 gradients) was never freed, where its peer saw DeepSpeed free it 2 ms after its last use; the
    peak read +8 to +19% over theory in 5 of 12 launches.

    Two signs of a lost free. The allocator hands out an address the profile still holds live: the storage there
    was freed unseen before. And a steady step keeps for the next as much as it found from the last (what it frees
    without having allocated it): of the storages the training thread allocated, handed to a collective and
    never freed, those beyond what the step found, size by size (the earliest first), lost their free. Each is
    counted as freed when the training thread was done with it (_StepEvents.done_with; by the address's reuse at
    the latest)."""
    cached = getattr(prof, "_shardbench_lost", {})  # each profiled step's peak reads it, and the lowest's kinds again
    if device_type in cached:
        return cached[device_type]
    step = _StepEvents.of(prof)
    live, carried_in, out = {}, Counter(), {}
    for e, fields in step.allocations:
        if fields.device.type != device_type:
            continue
        ptr, size, t = fields.ptr, fields.alloc_size, e.start_time_ns
        if size > 0:
            if ptr in live:  # handed out again while the profile holds it: freed unseen, by now at the latest
                born, held, _ = live[ptr]
                out[(born, ptr)] = LostFree(held, step.done_with(ptr, born, t) or t, t, size)
            live[ptr] = (t, size, e.start_tid)
        elif live.pop(ptr, None) is None:
            carried_in[-size] += 1
    end = step.allocations[-1][0].start_time_ns if step.allocations else 0
    for ptr, (t, size, tid) in sorted(live.items(), key=lambda kv: kv[1][0]):
        if tid != step.training or not step.collective_read(ptr, t):
            continue
        if carried_in[size]:
            carried_in[size] -= 1
            continue
        done = step.done_with(ptr, t, end)
        if done is not None:
            out[(t, ptr)] = LostFree(size, done)
    prof._shardbench_lost = {**cached, device_type: out}
    return out


def with_lost_frees(timeline, lost: Dict[tuple, LostFree]) -> list:
    """torch's MemoryProfile timeline with the frees the profile lost put back (lost_frees).

    A lost storage torch kept apart is destroyed when the training thread was done with it. One whose address the
    allocator handed out again torch took for the same storage as the next one there (it saw no free between
    them): one tensor, created at the last birth, sized as the first, destroyed once (measured: a lost 250,496 B
    bucket's address reused by a 16,384 B activation read as 250,496 B live for 5.6 ms). That tensor's entries
    are split back into the storages that were, each created at its birth with its own size and destroyed when
    done with. An allocation torch ties to no tensor is left as it is."""
    from torch.profiler._memory_profiler import Action, TensorKey
    created = {(t, key.storage.ptr): key for t, action, (key, _), _ in timeline
               if isinstance(key, TensorKey) and action == Action.CREATE}

    def version_at(key, t: int) -> int:
        return sum(1 for u, action, (k, _), _ in timeline if k == key and action == Action.INCREMENT_VERSION and u <= t)

    out = list(timeline)
    chains: Dict[int, Dict[int, LostFree]] = {}  # address -> {birth: lost free} of the storages torch merged
    for (born, ptr), lf in lost.items():
        key = created.get((born, ptr))
        if key is not None:  # kept apart: only its free is missing
            out.append((lf.done, Action.DESTROY, (key, version_at(key, lf.done)), lf.bytes))
        elif lf.reborn is not None:
            chains.setdefault(ptr, {})[born] = lf
    for ptr, chain in chains.items():
        last = max(lf.reborn for lf in chain.values())
        key = created.get((last, ptr))
        if key is None:
            continue
        storages = sorted([(born, lf.bytes, lf.done) for born, lf in chain.items()]
                          + [(last, next(lf.reborn_bytes for lf in chain.values() if lf.reborn == last), None)])

        def size_at(t: int, storages=storages) -> int:
            return [size for born, size, _ in storages if born <= t][-1] if t >= storages[0][0] else storages[0][1]
        out = [(t, action, (k, v), size_at(t) if k == key else size) for t, action, (k, v), size in out
               if not (k == key and action == Action.CREATE)]
        for born, size, done in storages:
            out.append((born, Action.CREATE, (key, 0), size))
            if done is not None:
                out.append((done, Action.DESTROY, (key, version_at(key, done)), size))
    return out


def profiled_events(prof) -> list:
    """Every event of the profile's tree, once (the tree is walked by each analysis that needs it)."""
    cached = getattr(prof, "_shardbench_events", None)
    if cached is None:
        cached, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            cached.append(event)
        prof._shardbench_events = cached
    return cached


def typed_events(prof) -> list:
    """(event, its kind, its fields) for every event of the profile, each event's `typed` read once. torch 2.13's
    binding of `typed` lets go of a reference to None it does not own on every read: on Python 3.11, where None
    is not immortal, a process that profiled many steps (a memory check's 64th cell at tp 2, its events read
    several times over) ended with "Fatal Python error: none_dealloc". Reading each once keeps that far off."""
    cached = getattr(prof, "_shardbench_typed", None)
    if cached is None:
        cached = [(e, *e.typed) for e in profiled_events(prof)]
        prof._shardbench_typed = cached
    return cached
