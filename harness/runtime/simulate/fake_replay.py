"""Count the work of a rank too large for this host: the replay (runtime/simulate/replay.py) on fake tensors, at two
shallow depths, extended block by block to the model's own.

A published run (experiments/published/) trains Llama 3 8B on 16,384 tokens a rank, or 70B: its rank's states and
activations do not fit this host, and its step would take hours on two cores. Its work is still a function of
its shapes alone, so the replay runs on torch's FakeTensorMode: every op is dispatched with its real shapes and
dtypes, through the same model, strategy and loop code as a real rank, and computes nothing. Two differences
from a real replay, each handled here:

- a value read back (`.item()`: the loss, a data index) has no value. `StandIns` answers a stand-in (0, 1.0,
  True); the numbers are not the point, the work is. Where a framework decides from a value it reads back, its
  family answers what a mirror rank reads (Family.fake_reads: DeepSpeed's checks across ranks agree, and its
  gradient norm is finite; backends/deepspeed/fake_reads.py), after the read's own work;
- `module.to(device)` to the device its fake parameters are on (DeepSpeed's engine does it) would swap each with
  itself, which torch refuses ("Couldn't swap Embedding.weight": the fake mode holds a weak reference to every
  fake tensor): inside, it returns the module, as it would leave real tensors where they are (`_moves_in_place`);
- a functional collective (DTensor's: tensor parallelism's, loss parallel's, FSDP2's gradient norm), and
  DeepSpeed-Ulysses' exchange (a custom op whose registered fake skips its all-to-all), is answered by the fake mode
  without any process group: the fake mode logs it as the mirror group logs the call it would make
  (`logging_fake_mode`), and a DeviceMesh's own tensor ops run on real tensors (traced.real_meshes);
- FakeTensorMode's own Python (its dispatch, for every op) is no rank's work, and reaching a Python mode costs
  every op Python lines of its own: so no line is counted on fake tensors. The step's lines are counted on real
  tensors at a narrow width instead (`narrow`), where the same Python runs.

The model's blocks are alike, so its work grows by one block's worth per block: the caller replays two depths
(`DEPTHS`) and adds the deeper one's increment once per further block (runtime/simulate/depth_extension.py). A
family whose buckets or partitions span blocks (Family.blockwise_work: DeepSpeed's) is replayed at the model's own
depth instead: llama_7b's 32 blocks under ZeRO-3 take this host 20 s on fake tensors.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..measure.work_count import count, count_ops

DEPTHS = (1, 2)  # the root's own work is in both; the second block adds what every block adds


class StandIns(TorchDispatchMode):
    """Over FakeTensorMode (entered after it): a value read back answers a stand-in."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 0
        return func(*args, **(kwargs or {}))


def replay_fake(cfg, settled_step) -> dict:
    """The counted work (Work.to_dict()) of `cfg` at its own depth: its ops and collectives replayed on fake
    tensors, its Python lines on real ones at a narrow width (`narrow`). `settled_step(cfg, first_steps)` builds
    a rank and trains its first steps (runtime/simulate/replay.py's, which calls this module: passed in, not
    imported)."""
    from ...config import families
    from .mirror_group import CallLog
    from .traced import real_meshes

    family = families.of(cfg.backend)
    # FSDP2 settles in its first step (its lazy init), ZeRO-3 in its second; a fake step costs this host 0.3-0.5 s
    settle = family.fake_settling_steps
    narrow_work = count(settled_step(narrow(cfg), first_steps=settle), CallLog())
    # a 2-D mesh (tensor parallelism under FSDP2) is concatenated with tensor ops a fake mode would fake
    with logging_fake_mode()(allow_non_fake_inputs=True), StandIns(), _masks_as_real(), _no_initial_values(), \
            real_meshes(), _moves_in_place(), family.fake_reads():
        counted = count_ops(settled_step(cfg, first_steps=settle), CallLog())
    return {"ops": counted["ops"], "collectives": counted["collectives"], "lines": narrow_work.lines}


def logging_fake_mode():
    """FakeTensorMode that logs each functional collective it answers (DTensor's: tensor parallelism's, loss
    parallel's, FSDP2's gradient norm) as the mirror group logs the call it would make on real tensors. Fake tensors
    answer them without any process group; the fake mode itself sees every one, those DTensor issues inside its
    own dispatch included, which a mode stacked above it does not."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .mirror_group import log_functional

    class Logging(FakeTensorMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            log_functional(func, args)
            return super().__torch_dispatch__(func, types, args, kwargs)
    return Logging


def narrow(cfg):
    """`cfg` at a width this host trains in a moment, every block, parameter and micro-batch still there: the
    same Python runs a step (the model's, the hooks', the optimizer's loop), which the width does not change.
    On fake tensors the dispatch into torch's Python modes would add its own lines to every op."""
    out = copy.deepcopy(cfg)
    m = out.model
    m.hidden_size = 4 * m.num_heads  # heads of 4 (rotary needs an even width)
    m.intermediate_size = 2 * m.hidden_size
    # a 256-token vocabulary: transformers warns that the special tokens' ids lie outside it, which no step reads
    m.vocab_size, m.max_positions = 256, 64
    m.init = "host"
    out.parallelism.seq_len = 16
    return out


@contextlib.contextmanager
def _moves_in_place():
    """`Module.to(device)` on a module whose fake tensors are all on that device returns it (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.nn.Module.to

    def to(module, *args, **kwargs):
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        held = [*module.parameters(), *module.buffers()]
        if dtype is None and memory_format is None and any(isinstance(t, FakeTensor) for t in held) and \
                all(device is None or t.device == torch.device(device) for t in held):
            return module
        return original(module, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original


@contextlib.contextmanager
def _no_initial_values():
    """A fake tensor holds no value: the seeded initial weights (runtime/initial_weights.py) are not written, a
    tenth of a fake replay's time, and none of its step's work."""
    from .. import initial_weights

    original = initial_weights.apply
    initial_weights.apply = lambda *args, **kwargs: None
    try:
        yield
    finally:
        initial_weights.apply = original


@contextlib.contextmanager
def _masks_as_real():
    """transformers builds an explicit causal mask for a tensor it takes to be traced, a fake one included, where
    a real rank skips it and runs causal attention: inside, its check ignores the tensor (compiling, jit tracing
    and stream capture are still seen)."""
    from transformers import masking_utils

    original = getattr(masking_utils, "is_tracing", None)
    if original is None:
        yield
        return
    masking_utils.is_tracing = lambda tensor=None: original(None)
    try:
        yield
    finally:
        masking_utils.is_tracing = original
