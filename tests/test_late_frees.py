"""The profiled peak where gloo frees a collective's buffer out of the profiler's sight (harness/runtime/measure/
late_frees.lost_frees): the training thread drops its reference first, and the last one goes on a thread the
profiler does not record, so the storage reads as live to the step's end, or, where the allocator hands its
address out again, torch's timeline takes both storages for one. ZeRO-2 under load read +8 to +19% over theory
that way (tests/test_grad_accumulation.py's parity-bf16 check failed CI on it). Here the step is made to lose the
free on purpose, on a real one-rank gloo group: a thread holds the bucket after the training thread dropped it."""
from __future__ import annotations

import pytest

from forked_ranks import run_ranks

# floats: an 8 MB bucket, its own mapping under the fixed mmap threshold set below, so that its address can be handed
# out again; and larger than any block the process unmaps meanwhile: the kernel maps top-down, into the highest hole
# that fits, so no hole above the bucket's fits it. A 320 KB bucket lost its place to the holes the profiler's own
# freed blocks left (CI: the second step mapped the next block elsewhere in five tries of five).
N = 1_001_000
PARAMS = 100


def lose_a_bucket_free(reuse: bool) -> dict:
    """One step under StepMemory and one under the bare profiler, each losing its bucket's free; then a tensor
    born where the bucket was (reuse: a little smaller, the same pages) or one too large for its place."""
    import ctypes
    import queue
    import threading

    import torch
    import torch.distributed as dist
    from torch.profiler import profile

    from harness.runtime.measure.late_frees import lost_frees
    from harness.runtime.measure.memory_profile import StepMemory

    if reuse:  # a fixed threshold (glibc raises its own past a freed block): each bucket-sized block mapped afresh
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: every block this size its own mapping
    next_size = 2 * N - 100 if reuse else 4 * N
    addresses = []

    class Params:
        def __init__(self):
            self.w = torch.ones(PARAMS)

        def state_tensors(self):
            return {"params": [self.w]}

        def unclassified_tensors(self):
            return {}

        def hidden_buffers(self):
            return False

    def step():
        held, release = queue.Queue(), threading.Event()

        def communication_thread():  # as gloo's worker holds a finished collective's work
            bucket = held.get()
            release.wait()
            del bucket

        thread = threading.Thread(target=communication_thread)
        thread.start()
        a = torch.ones(N)
        bucket = torch.cat([a, a])
        dist.all_reduce(bucket)
        y = bucket * 2  # its last use
        addresses.append(bucket.data_ptr())
        held.put(bucket)
        del bucket
        release.set()
        thread.join()
        later = torch.ones(next_size)
        addresses.append(later.data_ptr())
        z = torch.ones(10 * N)  # the peak, after the bucket's free
        del z, y, a, later

    def measured() -> dict:
        addresses.clear()
        peaks = {}
        for by_kind in (True, False):
            memory = StepMemory(Params(), torch.device("cpu"), by_kind=by_kind)
            with memory.profiled():
                step()
            peaks[by_kind] = memory.lowest()["peak"]
        with profile(profile_memory=True, record_shapes=True) as prof:
            step()
        lost = [(lf.bytes, lf.reborn is not None) for lf in lost_frees(prof, "cpu").values() if lf.bytes == 8 * N]
        return {"peaks": peaks, "lost": lost, "reused": [a == b for a, b in zip(addresses[0::2], addresses[1::2])],
                "expected": 4 * (PARAMS + N + 2 * N + next_size + 10 * N)}

    return measured()


@pytest.mark.parametrize("reuse", [False, True], ids=["kept apart", "address reused"])
def test_a_bucket_freed_out_of_the_profilers_sight_is_counted_freed_at_its_last_use(reuse):
    for _ in range(3):  # where the kernel maps the next block is its own choice, into the highest hole that fits:
        # a fork of make test's worker inherited the holes its earlier tests left, and the second step mapped it
        # elsewhere in three tries of three ([True, False, True]; alone it passed). So a new interpreter, and the
        # premise retried, never the check
        (found,) = run_ranks(lose_a_bucket_free, 1, reuse, fresh=True)
        if found["reused"] == [reuse] * 3:
            break
    assert found["reused"] == [reuse] * 3  # the case named is the case run, in each of the three steps
    assert found["lost"] == [(8 * N, reuse)]  # the free was lost, and found
    # both readings: the allocations alone (the profiled steps' peaks) and torch's timeline (the peak by kind);
    # uncorrected, each read the bucket as live at the peak (+8,008,000 B)
    assert found["peaks"] == {True: found["expected"], False: found["expected"]}
