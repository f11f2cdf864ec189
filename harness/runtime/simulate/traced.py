"""One rank of a run at any world size, on fake tensors over a fake process group: what the code allocates and
sends, with no hardware (`python -m harness scale-check`, `shardbench estimate --traced`).

Rank 0 of a world of N is built exactly as a real rank is (runtime/worker.prepare: the model's construction
and init path, the strategy's wrapping, mixed-precision policy and optimizer), then runs the train loop's own
step (runtime/loop.TrainStep) under:

- torch's `FakeTensorMode`: every tensor has a shape, dtype and device but no storage, so a 70B model at a
  world of 512 costs seconds of Python, not memory;
- the "fake" process group (torch.testing's FakeStore): every collective returns at once, with outputs of the
  right shape, as if N-1 peers had answered;
- the strategy's memory tracker (Strategy.memory_tracker: torch.distributed._tools' FSDPMemTracker for FSDP2,
  MemTracker otherwise), which counts every storage by kind as the dispatcher allocates and frees it;
- runtime/measure/collective_count.py's `CollectiveCounter`, which records every c10d collective the step issues,
  with its buffer's bytes and its group's ranks.

Only the last step is tracked. The first ones, untracked, create the optimizer state and fill DTensor's
sharding-propagation cache: on its first call for an op (the grad-norm's `_foreach_norm` in step 1) DTensor
runs the op on fake tensors of the global, unsharded shapes to learn the output's. On a real run those hold no
memory, but here every tensor is fake and the tracker counted them: 4 bytes a parameter "activations", which
was the traced peak of llama_7b and llama_13b with activation checkpointing (+91% to +444%) before.

What this does not tell about a real GPU run: it counts tensors the code allocates, not the CUDA caching
allocator's reserve, its rounding or fragmentation, nor the CUDA context; and it times nothing. It runs on the
CPU code path (FSDP2 asks the CUDA runtime for its device, which a machine without a GPU does not have), so
what differs on CUDA (AdamW's foreach default) is the theory's alone.
"""
from __future__ import annotations

import contextlib
import functools
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ...config import families
from .. import schedule
from ...theory import allocator
from ..measure.collective_count import counter_for
from .allocations import AllocationLog

# the tracker's kinds, mapped onto the theory's (theory/memory.layout's components, and the transients)
KINDS = {"Sharded Param": "params", "Parameter": "params", "Sharded Grad": "grads", "Gradient": "grads",
         "OptState": "optimizer", "Optstate": "optimizer", "Activation": "activations",
         "Unsharded Param": "gathered_params", "Unsharded Grad": "unsharded_grads", "All Gather": "all_gather",
         "Reduce Scatter": "reduce_scatter", "Temp": "temporaries", "Buffer": "buffers", "Inputs": "inputs",
         "Other": "other"}
STATES = ("params", "grads", "optimizer")

def by_kind(snapshot: Dict) -> Dict[str, int]:
    """A tracker snapshot ({device: {kind: bytes}}) as the theory's kinds, summed over devices, with `total`."""
    out: Dict[str, int] = {}
    for kinds in snapshot.values():
        for kind, nbytes in kinds.items():
            name = "total" if kind == "Total" else KINDS.get(getattr(kind, "value", kind), str(kind))
            out[name] = out.get(name, 0) + int(nbytes)
    return {k: v for k, v in out.items() if v or k == "total"}


@dataclass
class Trace:
    """What one traced rank allocated and sent, or why it could not be traced."""
    ok: bool
    seconds: float
    peak: Dict[str, int] = field(default_factory=dict)  # the tracker's peak snapshot, by kind, with total
    states: Dict[str, int] = field(default_factory=dict)  # after the last step's backward, by kind
    collectives: List[dict] = field(default_factory=list)  # one optimizer step's (the last one's)
    settings: dict = field(default_factory=dict)
    # the caching allocator replayed over the last step's allocations (theory/allocator.py): peak allocated,
    # and peak reserved with native and with expandable segments
    allocator: dict = field(default_factory=dict)
    error: Optional[str] = None  # the exception's type and first line, where the trace failed
    where: Optional[str] = None  # the innermost frame of the harness or the framework it came from


def _cause(exc: BaseException, frameworks: Tuple[str, ...]) -> Tuple[str, str]:
    """The exception's first line, and the innermost frame of the harness or of the family's own framework
    packages (`frameworks`): where a user would look, not torch's internals it ended in."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/harness/" in f.filename or any(f"/{p}/" in f.filename for p in frameworks)]
    where = ours[-1] if ours else (frames[-1] if frames else None)
    # a path from the repository or the site-packages root, the same on every machine
    path = where.filename.split("site-packages/")[-1] if where else ""
    path = "harness/" + path.split("/harness/", 1)[1] if "/harness/" in path else path
    return f"{type(exc).__name__}: {first}", (f"{path}:{where.lineno} ({where.name})" if where else "")


@contextlib.contextmanager
def real_meshes():
    """A DeviceMesh is a real tensor of ranks, made and searched with tensor ops (`arange`, `nonzero`) that a
    fake mode would fake: FSDP2 concatenates its data-parallel mesh with a tensor-parallel parameter's mesh
    inside the traced setup (the harness makes its own meshes outside fake mode: runtime/device_mesh.py). Those
    two DeviceMesh methods run on real tensors while tracing."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    originals = {name: DeviceMesh.__dict__[name] for name in ("_compute_coordinates_from_mesh", "_concatenate")}

    def real(descriptor):
        function = descriptor.__func__

        def run(*args, **kwargs):
            with unset_fake_temporarily():
                return function(*args, **kwargs)
        return type(descriptor)(run)  # staticmethod or classmethod, as it was

    for name, descriptor in originals.items():
        setattr(DeviceMesh, name, real(descriptor))
    try:
        yield
    finally:
        for name, descriptor in originals.items():
            setattr(DeviceMesh, name, descriptor)


@contextlib.contextmanager
def propagation_untracked(tracker):
    """DTensor learns an op's output shape by running the op on fake tensors of the global, unsharded shapes
    (ShardingPropagator._propagate_tensor_meta_non_cached), in the active fake mode, which here is the trace's own,
    and without its cache while a fake mode is active. torch's tracker skips only the propagation run in another
    fake mode than the one it was entered in, so it counted those global tensors: under loss parallel the whole
    vocabulary's logits, 160 GiB of "activations" on the published 70B 2-D row (tp 8, micro-batch 16), which
    ran in 71.9 GiB. While DTensor propagates, the tracker is told it was entered elsewhere."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached
    elsewhere = object()

    def propagate(self, op_schema):
        entered, tracker._fake_mode_on_entry = tracker._fake_mode_on_entry, elsewhere
        try:
            return original(self, op_schema)
        finally:
            tracker._fake_mode_on_entry = entered

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


@contextlib.contextmanager
def balanced_routing(cfg):
    """Expert parallelism reads its all-to-all's split sizes from the routing (transformers' AllToAllEP:
    `torch.stack([send, recv]).tolist()`), which a fake tensor does not hold. Answered here as the balanced
    routing the theory assumes: each rank sends k x T / ep rows to every ep rank and receives as many (what a
    real rank reads varies with the router: docs/moe.md). Only a fake (2, ep) integer tensor is answered; any
    other `.tolist()` is torch's."""
    ep = max(cfg.parallelism.get("ep", 1) or 1, 1)
    if ep == 1:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensor

    par = cfg.parallelism
    rows = cfg.model.experts_per_token * par.micro_batch * par.seq_len // max(par.cp, 1)
    original = FakeTensor.tolist

    def tolist(tensor):
        if tensor.shape == (2, ep) and not tensor.is_floating_point():
            return [[rows // ep] * ep, [rows // ep] * ep]
        return original(tensor)

    FakeTensor.tolist = tolist
    try:
        yield
    finally:
        FakeTensor.tolist = original


def allocator_peaks(events) -> Dict[str, int]:
    """The allocator's peaks over a step's events: allocated (blocks, rounded), reserved natively and with
    expandable segments, and the bytes in use as the tracker counts them (unrounded)."""
    native, grown = allocator.replay(events), allocator.replay(events, expandable=True)
    return {"live": allocator.live_peak(events), "allocated": native.peak_allocated, "reserved": native.peak_reserved,
            "reserved_expandable": grown.peak_reserved, "segments": native.segments,
            "reserved_by_stream": native.by_stream}


def trace(cfg, world: int, steps: int = 2) -> Trace:
    """Rank 0 of `world` ranks, built and stepped `steps` times on fake tensors (the first step creates the
    optimizer state; the peak and the collectives are the last step's with the state in place)."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ..loop import TrainStep
    from ..worker import prepare

    start = time.perf_counter()
    device = torch.device("cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), real_meshes(), balanced_routing(cfg):
            ready = prepare(cfg, 0, world, device)
            batches = ready.batches
            real_get = batches.get

            def get(step: int, micro: int):
                # the batch is read from the real corpus (its sampling reads values), then made fake
                with unset_fake_temporarily():
                    inputs, targets = real_get(step, micro)
                return inputs.to(device), targets.to(device)

            batches.get = get
            step = TrainStep(ready.model, ready.strategy, batches, cfg.parallelism.grad_accum, device,
                             functools.partial(schedule.learning_rate, cfg.optim, cfg.train.steps))
            for i in range(steps - 1):  # untracked: creates the optimizer state and warms DTensor's caches
                step(i, mean_loss=False)
            tracker, counter, states = ready.strategy.memory_tracker(), counter_for(ready.strategy.mesh), {}
            log = AllocationLog(ready.strategy.allocator_streams())
            with log.on(tracker), tracker, propagation_untracked(tracker), counter:
                step(steps - 1, lambda: states.update(by_kind(tracker.get_tracker_snapshot("current"))),
                     mean_loss=False)
            return Trace(True, time.perf_counter() - start, peak=by_kind(tracker.get_tracker_snapshot("peak")),
                         states={k: states.get(k, 0) for k in STATES}, collectives=counter.rows(),
                         settings=ready.strategy.effective_settings(), allocator=allocator_peaks(log.events))
    except Exception as exc:  # noqa: BLE001 - a backend that cannot run on fake tensors is a result, with its cause
        error, where = _cause(exc, families.of(cfg.backend).packages)
        return Trace(False, time.perf_counter() - start, error=error, where=where)
    finally:
        dist.destroy_process_group()
