"""The strategy interface of every backend, in this process: a one-rank gloo group (no torchrun, no subprocess),
the backend's own construction (runtime/worker.prepare) and two micro-batches of a step, against a plain model
built from the same seed and stepped by hand. About 20 s for all eight backends, imports included.

What each backend must do, asserted by what its config says it does (not by its name):
- `backward` takes the raw micro-batch loss and scales it for accumulation: after two micro-batches the norm
  `step()` returns is the pre-clip norm of the mean loss's gradient, which a strategy that forgot the 1/grad_accum
  would double;
- `step()` steps the optimizer: the next loss equals the hand-stepped reference's;
- a backend that defers gradient sync issues no reduction before the last micro-batch (the profiler's view of
  the collectives); one that partitions gradients (ZeRO-2/3) reduces every micro-batch, by design;
- `state_tensors()` names components the memory model knows, offloaded ones with the `host_` prefix exactly
  when the config offloads them (DeepSpeed's offload_* fields, FSDP2's cpu_offload).
A backend that shards parameters (FSDP2) issues no reduce-scatter on one rank, so that its last micro-batch
does reduce is held by the 2-rank test_grad_accumulation.py.
"""
from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from conftest import BACKENDS
from harness.config.compose import compose
from harness.config import families
from harness.core.components import STATE_COMPONENTS
from harness.core.paths import extensions_dir

REDUCTIONS = ("allreduce", "all_reduce", "reduce_scatter")
GRAD_ACCUM = 2


@pytest.fixture(scope="module")
def one_rank():
    """A one-rank gloo group in this process (DeepSpeed reads torchrun's variables), removed afterwards."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29997",
           "TORCH_EXTENSIONS_DIR": extensions_dir()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    linear = torch.nn.functional.linear
    yield
    torch.nn.functional.linear = linear  # ZeRO-3's engine replaces it for every later module
    dist.destroy_process_group()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def reductions(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(any(r in e.name.lower() for r in REDUCTIONS) for e in prof.events())


def reference(cfg):
    """The same model from the same seed, built and stepped by hand with torch's AdamW."""
    from harness.runtime import initial_weights, models

    torch.manual_seed(cfg.train.seed)
    model = models.build(cfg.model, workload=cfg.workload)
    initial_weights.apply(model, cfg.train.seed, lambda params: contextlib.nullcontext(), None)
    o = cfg.optim
    return model, torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                    weight_decay=o.weight_decay)


def loss_of(model, batch) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(input_ids=inputs).logits.float().flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_scales_step_steps_and_sync_waits_for_the_last_micro_batch(one_rank, backend):
    from harness.runtime.worker import prepare

    cfg = compose([f"backend={backend}", f"parallelism.grad_accum={GRAD_ACCUM}", "logger=none", "profile=parity"])
    ready = prepare(cfg, 0, 1, torch.device("cpu"))
    strategy, model = ready.strategy, ready.model
    ref, ref_optimizer = reference(cfg)
    counts = []
    for micro in range(GRAD_ACCUM):
        batch = ready.batches.get(0, micro)

        def micro_batch():
            with strategy.sync_context(last=micro == GRAD_ACCUM - 1):
                with strategy.autocast():
                    loss = loss_of(model, batch)
                strategy.backward(loss)  # the raw loss: scaling is the strategy's job

        counts.append(reductions(micro_batch))
        (loss_of(ref, batch) / GRAD_ACCUM).backward()
    norm = float(strategy.step())
    ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.optim.grad_clip))
    ref_optimizer.step()
    assert norm == pytest.approx(ref_norm, rel=1e-5), "the norm step() returns is not the mean loss's gradient's"

    after = ready.batches.get(1, 0)
    with torch.no_grad(), strategy.autocast():
        stepped = float(loss_of(model, after))
    with torch.no_grad():
        expected = float(loss_of(ref, after))
    assert stepped == pytest.approx(expected, rel=1e-5), "one optimizer step does not match AdamW by hand"

    family = families.of(cfg.backend)
    if family.defers_gradient_sync(cfg.backend):
        assert counts[0] == 0, f"{backend} reduced gradients before the last micro-batch: {counts}"
        # and reduces on the last one; a backend that shards parameters has nothing to reduce-scatter on one
        # rank (FSDP2), so test_grad_accumulation.py holds that on two
        assert counts[-1] > 0 or family.paper_stage(cfg.backend) == 3, f"{backend} never reduced: {counts}"
    else:  # ZeRO-2/3 partition gradients: DeepSpeed reduce-scatters every micro-batch by design
        assert counts[0] > 0 and counts[0] == counts[-1], counts

    keys = set(strategy.state_tensors())
    known = set(STATE_COMPONENTS) | {f"host_{c}" for c in STATE_COMPONENTS} | {"buffers"}
    assert keys <= known, keys - known
    for component in ("optimizer", "params"):  # on the host exactly when the config offloads it
        # DeepSpeed's offload_optimizer / offload_params; FSDP2's CPUOffloadPolicy moves both
        offloaded = bool(cfg.backend[f"offload_{component}"] or cfg.backend.cpu_offload)
        assert (f"host_{component}" in keys) == offloaded and (component in keys) != offloaded, keys


def test_a_preemption_signal_saves_at_the_next_step_boundary_then_stops(one_rank, tmp_path):
    """runtime/train_state.py: the signal is noted whenever it comes; the ranks agree after the step, save
    there (a complete checkpoint) and stop with Preempted, except after the last step, when the run ends anyway."""
    import signal

    from harness.core.checkpoint_dirs import is_complete, step_dir
    from harness.runtime.errors import Preempted
    from harness.runtime.train_state import Checkpointer
    from harness.runtime.worker import prepare

    cfg = compose(["backend=ddp", "logger=none", "profile=parity"])
    strategy = prepare(cfg, 0, 1, torch.device("cpu")).strategy
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        checkpointer = Checkpointer(strategy, tmp_path, 0, False, {}, lambda directory, rank: [],
                                    preempt_signal=signal.SIGUSR2)
        assert checkpointer.after_step(0, timed=True) is False and not list(tmp_path.iterdir())
        os.kill(os.getpid(), signal.SIGUSR2)
        assert checkpointer.after_step(1, timed=True, last=True) is False
        with pytest.raises(Preempted) as stopped:
            checkpointer.after_step(2, timed=True)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert stopped.value.step == 3 and "SIGUSR2" in str(stopped.value)
    assert is_complete(step_dir(tmp_path, 3)) and [s["step"] for s in checkpointer.saves] == [3]
