"""The storages a communication library frees late, read off torch's profiler (runtime/measure/memory_profile.py counts
them as freed when the training thread was done with them): gloo keeps a finished collective's tensors until it
moves on, at a moment that changes from run to run."""
from __future__ import annotations

from typing import Dict


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


def collective_frees(prof) -> Dict[tuple, int]:
    """(free time, pointer) -> when the training thread was done with that storage, for the buffers a
    communication library frees late. gloo keeps a finished collective's work, and with it its tensors, until
    it moves on, at a moment that changes from run to run: measured, ZeRO-2's flattened gradient bucket was
    freed right after its all-reduce in some runs and inside the next collective call, a whole optimizer step
    later, in others (a 10% swing of a tiny model's peak, rank by rank). A storage that the training thread
    frees inside a collective call that does not use it, or that another thread frees, was held by the
    communication library; it is counted as freed when the training thread was last done with it: the end of
    its last use by an op, and at least the end of the first collective call after its allocation. Needs the
    profile's record_shapes (op inputs)."""
    import bisect
    import itertools

    from torch._C._profiler import _EventType
    events = typed_events(prof)
    allocations = sorted(((e, fields) for e, kind, fields in events if kind == _EventType.Allocation),
                         key=lambda ef: ef[0].start_time_ns)
    if not allocations:
        return {}
    training = training_thread(allocations)
    ops = [(op, storages_read(fields)) for op, kind, fields in events
           if kind == _EventType.TorchOp and op.start_tid == training]
    # the training thread's collective calls, in order: one thread runs one call at a time
    calls = sorted(((op.start_time_ns, op.end_time_ns, used) for op, used in ops if op.name.startswith("c10d::")),
                   key=lambda c: c[0])
    starts = [c[0] for c in calls]
    reach = list(itertools.accumulate((c[1] for c in calls), max))  # the latest end among calls[:k + 1]
    uses: Dict[int, list] = {}
    for op, used in ops:
        for ptr in used:
            uses.setdefault(ptr, []).append(op.end_time_ns)
    out, allocated_at = {}, {}
    for e, fields in allocations:
        ptr, size, t = fields.ptr, fields.alloc_size, e.start_time_ns
        if size > 0:
            allocated_at[ptr] = t
            continue
        # the latest-begun call that holds time t (a call may run inside another): none when no call that
        # began by now reaches t, which is most frees
        i = bisect.bisect_right(starts, t) - 1
        while i >= 0 and reach[i] >= t and calls[i][1] < t:
            i -= 1
        inside = i >= 0 and calls[i][1] >= t
        late = e.start_tid != training or (inside and ptr not in calls[i][2])
        born = allocated_at.get(ptr)
        if not late or born is None:
            continue
        after = [end for start, end, _ in calls[bisect.bisect_left(starts, born):] if end <= t]
        used = [u for u in uses.get(ptr, []) if born <= u <= t]
        done = max(used + after[:1]) if used or after else None
        if done is not None and done < t:
            out[(t, ptr)] = done
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
