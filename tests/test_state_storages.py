"""The storages a profiled step takes as live from its start (harness/runtime/measure/memory_profile.state_storages):
every model state, the strategy's own buffers, and what it holds but cannot classify, each storage once.

The allocation replay (train.peak_by_kind=false, what `make memory-check` runs) counts a storage live from the
step's start only if it is among these or the step frees it. ZeRO-3 keeps its reduce bucket from step to step and
never frees it; on a mixture of experts, whose ZeRO-3 optimizer also held a then unclassified attribute
(`leaf_parameters`), the unclassified tensors replaced the buffers, the bucket went uncounted, and the check read
the peak one bucket low (-12.5% on tiny Mixtral, +0.9% by torch's data-flow analysis of the same step)."""
from __future__ import annotations

import torch

from harness.runtime.measure.memory_profile import state_storages


class Holder:
    """A strategy's three answers, as DeepSpeed's ZeRO-3 gives them on a mixture of experts."""

    def __init__(self, unclassified):
        self.shard, self.moment = torch.zeros(64), torch.zeros(64)
        self.bucket = torch.zeros(256)  # the reduce bucket, held across steps
        self.flat = torch.zeros(32)
        self.view = self.flat[8:]  # a view of a state: its storage is counted once, as the state's
        self.unclassified = unclassified

    def state_tensors(self):
        return {"params": [self.shard, self.flat], "optimizer": [self.moment], "buffers": [self.bucket]}

    def unclassified_tensors(self):
        return self.unclassified


def test_a_steps_live_storages_keep_the_buffers_beside_what_the_strategy_cannot_classify():
    loose = torch.zeros(16)
    holder = Holder({})
    holder.unclassified = {"leaf_parameters": [loose, holder.view], "other": [torch.zeros(0)]}
    found = state_storages(holder, torch.device("cpu"))
    by_ptr = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
              for t in (holder.shard, holder.flat, holder.moment, holder.bucket, loose)}
    assert {ptr: size for ptr, (_, size) in found.items()} == by_ptr
    assert found[holder.bucket.untyped_storage().data_ptr()] == ("temporaries", 1024)
    assert found[holder.flat.untyped_storage().data_ptr()] == ("params", 128)  # a state's kind, not a buffer's
    assert found[loose.untyped_storage().data_ptr()] == ("temporaries", 64)


def test_without_unclassified_tensors_the_buffers_are_the_strategys_own():
    holder = Holder({})
    found = state_storages(holder, torch.device("cpu"))
    assert sum(size for _, size in found.values()) == 4 * (64 + 32 + 64 + 256)
