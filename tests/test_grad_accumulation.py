"""Gradient accumulation without gradient synchronisation on non-final micro-batches, measured by counting
the reduction collectives the profiler sees (real gloo collectives, no mocks), on two ranks: for the backends that
shard parameters, which reduce nothing on the one rank of tests/test_strategy_interface.py (every other backend,
ZeRO-2/3 reducing every micro-batch by design, is held there). The two ranks are forked from this process
(tests/forked_ranks.py): no start-up to pay."""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from conftest import BACKENDS
from forked_ranks import run_ranks
from harness.config import families
from harness.config.compose import compose

pytestmark = pytest.mark.slow
REDUCTIONS = ("allreduce", "all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_base")


def sharded_deferring_backends() -> list:
    """The backends that defer gradient sync and shard parameters (FSDP2): on one rank they have nothing to
    reduce-scatter, so tests/test_strategy_interface.py, which holds the others in-process, cannot see their last
    micro-batch reduce."""
    found = []
    for name in BACKENDS:
        backend = compose([f"backend={name}"]).backend
        family = families.of(backend)
        if family.defers_gradient_sync(backend) and family.paper_stage(backend) == 3:
            found.append(name)
    return found


def reductions(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(any(r in e.name.lower() for r in REDUCTIONS) for e in prof.events())


def counted_reductions(backends: list) -> dict:
    """On each rank: a micro-batch's forward and backward with sync suppressed (non-final), then one with it
    (final), each backend's reduction collectives counted."""
    import torch.distributed as dist

    from harness.runtime import models
    from harness.runtime.strategies import make_strategy

    out = {}
    for backend in backends:
        cfg = compose([f"backend={backend}", "parallelism.grad_accum=2"])
        torch.manual_seed(0)
        strategy = make_strategy(cfg, torch.device("cpu"), dist.get_world_size(), models.param_count(cfg.model))
        model = strategy.setup(models.build(cfg.model), cfg.optim)
        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(dist.get_rank()))

        def micro(last):
            with strategy.sync_context(last):
                strategy.backward(model(input_ids=ids).logits.float().mean())

        out[backend] = {"non_final": reductions(lambda: micro(False)), "final": reductions(lambda: micro(True))}
        strategy.step()
    return out


def test_no_gradient_reduction_before_the_last_micro_batch_and_one_on_it():
    backends = sharded_deferring_backends()
    assert backends, "no backend both defers gradient sync and shards parameters"
    for counts in run_ranks(counted_reductions, 2, backends):
        for backend in backends:
            assert counts[backend]["non_final"] == 0, (backend, counts[backend])
            assert counts[backend]["final"] > 0, (backend, counts[backend])
