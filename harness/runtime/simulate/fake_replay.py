"""Count the work of a rank too large for this host: the replay (runtime/simulate/replay.py) on fake tensors, at two
shallow depths, extended block by block to the model's own.

A published run (experiments/published/) trains Llama 3 8B on 16,384 tokens a rank, or 70B: its rank's states and
activations do not fit this host, and its step would take hours on two cores. Its work is still a function of
its shapes alone, so the replay runs on torch's FakeTensorMode: every op is dispatched with its real shapes and
dtypes, through the same model, strategy and loop code as a real rank, and computes nothing. Two differences
from a real replay, each handled here:

- a value read back (`.item()`: the loss, a data index) has no value. `StandIns` answers a stand-in (0, 1.0,
  True); the numbers are not the point, the work is. A framework that decides from values it reads back cannot
  be counted this way (DeepSpeed compares list lengths across ranks): the caller reports it as not counted;
- a functional collective (DTensor's: tensor parallelism's, loss parallel's, FSDP2's gradient norm) is answered by
  the fake mode without any process group: the fake mode logs it as the mirror group logs the call it would make
  (`logging_fake_mode`), and a DeviceMesh's own tensor ops run on real tensors (traced.real_meshes);
- FakeTensorMode's own Python (its dispatch, for every op) is no rank's work, and reaching a Python mode costs
  every op Python lines of its own: so no line is counted on fake tensors. The step's lines are counted on real
  tensors at a narrow width instead (`narrow`), where the same Python runs.

The model's blocks are alike, so its work grows by one block's worth per block. `extend` replays two depths
(`DEPTHS`) and adds the deeper one's increment once per further block, exact wherever every block's work is its
own (FSDP2's per-block gathers and reduce-scatters; not DDP's buckets, which span blocks).
"""
from __future__ import annotations

import collections
import contextlib
import copy
from typing import Dict, List, Tuple

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
    from .mirror_group import CallLog
    from .traced import real_meshes

    narrow_work = count(settled_step(narrow(cfg), first_steps=1), CallLog())
    # a 2-D mesh (tensor parallelism under FSDP2) is concatenated with tensor ops a fake mode would fake
    with logging_fake_mode()(allow_non_fake_inputs=True), StandIns(), _masks_as_real(), _no_initial_values(), \
            real_meshes():
        # FSDP2 settles in its first step (its lazy init); a fake step costs this host 0.3-0.5 s
        counted = count_ops(settled_step(cfg, first_steps=1), CallLog())
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


def _whole(x):
    """An extended count or size: an int where it is one."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _key(row: list) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in row[:-1])


def _extend_rows(shallow: List[list], deep: List[list], k: float, group_of, sizes: Tuple[int, ...],
                 make) -> List[list]:
    """Rows (each a key and a count) extended by `k` increments: a row in both depths by its count; a row whose
    sizes change with depth (a foreach op over every parameter, the root's gather) by its sizes, paired with the
    shallow row of the same group in size order; a row of neither kind kept as the deep one has it."""
    a = collections.Counter({_key(r): r[-1] for r in shallow})
    b = collections.Counter({_key(r): r[-1] for r in deep})
    out = [make(key, _whole(b[key] + k * (b[key] - a[key]))) for key in b
           if key in a and b[key] + k * (b[key] - a[key]) > 0]
    groups: Dict[tuple, tuple] = collections.defaultdict(lambda: ([], []))
    for key in a:
        if key not in b:
            groups[group_of(key)][0].append(key)
    for key in b:
        if key not in a:
            groups[group_of(key)][1].append(key)
    for only_a, only_b in groups.values():
        if len(only_a) != len(only_b):
            out.extend(make(key, b[key]) for key in only_b)
            continue
        for p, q in zip(sorted(only_a, key=lambda t: [t[i] for i in sizes]),
                        sorted(only_b, key=lambda t: [t[i] for i in sizes])):
            grown = list(q)
            for i in sizes:
                grown[i] = _whole(q[i] + k * (q[i] - p[i]))
            out.append(make(tuple(grown), b[q]))
    return out


def extend(shallow: dict, deep: dict, depths: Tuple[int, int], depth: int) -> dict:
    """The Work dict at `depth` blocks from those at `depths` (shallow, deep): linear in the number of blocks."""
    k = (depth - depths[1]) / (depths[1] - depths[0])
    # an op row: [phase, kind, op, dtype, flops, nbytes, elements, cold, count]; grouped by (phase, kind, op,
    # dtype), its sizes are flops, nbytes and elements (cold bytes grow with them; they are not priced on a GPU)
    ops = _extend_rows(shallow["ops"], deep["ops"], k, lambda key: key[:4], (4, 5, 6),
                       lambda key, n: [*key[:7], list(key[7]), n])
    fields = sorted({f for c in deep["collectives"] for f in c if f != "count"})

    def as_row(c: dict) -> list:
        return [c.get(f) for f in fields] + [c["count"]]

    size, group_fields = fields.index("size_bytes"), [f for f in ("op", "group", "phase") if f in fields]
    collectives = _extend_rows([as_row(c) for c in shallow["collectives"]], [as_row(c) for c in deep["collectives"]],
                               k, lambda key: tuple(key[fields.index(f)] for f in group_fields), (size,),
                               lambda key, n: {**dict(zip(fields, (list(v) if isinstance(v, tuple) else v
                                                                   for v in key))), "count": n})
    lines = {p: _whole(max(deep["lines"].get(p, 0) + k * (deep["lines"].get(p, 0) - shallow["lines"].get(p, 0)), 0))
             for p in set(shallow["lines"]) | set(deep["lines"])}
    return {"ops": ops, "lines": lines, "collectives": collectives}
